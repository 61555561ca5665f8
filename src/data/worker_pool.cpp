#include "tandem/data/worker_pool.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>

namespace tandem::data {

WorkerPool::WorkerPool(int threads) {
  for (int t = 0; t < threads; ++t) threads_.emplace_back([this] { tasks_.run_until_stopped(); });
}

WorkerPool::~WorkerPool() {
  tasks_.stop();
  for (auto& thread : threads_) thread.join();
}

void WorkerPool::parallel_for(int64_t count, const std::function<void(int64_t)>& fn) {
  // Owned jointly with the queued helpers: a helper queued behind other callers' work may start after this call
  // has returned, find no item left, and must still have a job to count into. Items are claimed one at a time,
  // so one slow image does not hold up a fixed share of the others.
  struct Job {
    std::atomic<int64_t> next{0};
    int64_t done = 0;
    std::mutex mutex;
    std::condition_variable finished;
  };
  auto job = std::make_shared<Job>();
  auto drain = [job, count, &fn] {
    int64_t mine = 0;
    for (int64_t i = job->next++; i < count; i = job->next++, ++mine) fn(i);
    // Count only after the loop: fn is the caller's, which lives until every item is done.
    std::lock_guard<std::mutex> lock(job->mutex);
    job->done += mine;
    if (job->done == count) job->finished.notify_all();
  };
  const int64_t helpers = std::min<int64_t>(static_cast<int64_t>(threads_.size()), count - 1);
  for (int64_t h = 0; h < helpers; ++h) tasks_.push(drain);
  drain();
  std::unique_lock<std::mutex> lock(job->mutex);
  job->finished.wait(lock, [&] { return job->done == count; });
}

}  // namespace tandem::data
