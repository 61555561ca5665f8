#include "tandem/util/task_queue.h"

#include <utility>

namespace tandem {

void TaskQueue::push(Task task) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    tasks_.push_back(std::move(task));
  }
  wake_.notify_one();
}

std::optional<TaskQueue::Task> TaskQueue::pop() {
  std::unique_lock<std::mutex> lock(mutex_);
  wake_.wait(lock, [this] { return stopped_ || !tasks_.empty(); });
  if (tasks_.empty()) return std::nullopt;
  Task task = std::move(tasks_.front());
  tasks_.pop_front();
  return task;
}

void TaskQueue::stop() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopped_ = true;
  }
  wake_.notify_all();
}

void TaskQueue::run_until_stopped() {
  while (std::optional<Task> task = pop()) (*task)();
}

}  // namespace tandem
