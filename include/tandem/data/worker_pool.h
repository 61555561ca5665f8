#pragma once
// The image folder's decoding threads: a few long-lived threads, fed by a TaskQueue, that run parallel_for
// calls. Several callers may use one pool at once (a loader's prefetch thread and the training thread), each
// waiting only for its own items.
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

#include "tandem/util/task_queue.h"

namespace tandem::data {

class WorkerPool {
 public:
  // threads = 0 is valid: parallel_for then runs everything on the calling thread.
  explicit WorkerPool(int threads);
  // Stops the queue and joins the threads; no parallel_for may be running.
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // Runs fn(i) for every i in [0, count) on the pool and the calling thread; returns when all are done.
  // fn must not throw (callers record failures per item).
  void parallel_for(int64_t count, const std::function<void(int64_t)>& fn);

 private:
  TaskQueue tasks_;
  std::vector<std::thread> threads_;
};

}  // namespace tandem::data
