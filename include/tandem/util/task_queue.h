#pragma once
// A first-in first-out queue of tasks for threads that do nothing but run them: the MPI thread (one consumer,
// so tasks run in the order they were pushed) and the image decoder's worker pool (several consumers).
// Any thread may push; consumers block in pop() until there is a task or the queue is stopped.
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>

namespace tandem {

class TaskQueue {
 public:
  using Task = std::function<void()>;

  void push(Task task);
  // The oldest task, waiting for one if there is none; empty once the queue is stopped and drained, which
  // tells a consumer to return. Tasks pushed before stop() still come out.
  std::optional<Task> pop();
  // Wakes every consumer; pop() returns empty once the tasks queued so far are drained.
  void stop();

  // pop() and run every task until the queue is stopped and drained: a consumer thread's whole body.
  void run_until_stopped();

 private:
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Task> tasks_;
  bool stopped_ = false;
};

}  // namespace tandem
