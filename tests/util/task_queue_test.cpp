// The task queue behind the MPI thread and the image decoder's worker pool: one consumer runs tasks in the
// order they were pushed, several consumers run every task once, and stop() lets consumers finish what was
// queued, then return.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>
#include <vector>

#include "tandem/util/task_queue.h"

namespace tandem {
namespace {

TEST(TaskQueue, OneConsumerRunsTasksInTheOrderTheyWerePushed) {
  TaskQueue queue;
  std::vector<int> order;
  for (int i = 0; i < 100; ++i) queue.push([&order, i] { order.push_back(i); });
  queue.stop();
  std::thread consumer([&] { queue.run_until_stopped(); });
  consumer.join();
  ASSERT_EQ(order.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(order[static_cast<size_t>(i)], i);
}

TEST(TaskQueue, PopWaitsForATaskAndReturnsEmptyOnceStoppedAndDrained) {
  TaskQueue queue;
  auto popped = std::async(std::launch::async, [&] { return queue.pop().has_value(); });
  EXPECT_EQ(popped.wait_for(std::chrono::milliseconds(50)), std::future_status::timeout) << "pop did not wait";
  queue.push([] {});
  EXPECT_TRUE(popped.get());

  auto after_stop = std::async(std::launch::async, [&] { return queue.pop().has_value(); });
  queue.stop();
  EXPECT_FALSE(after_stop.get());
  EXPECT_FALSE(queue.pop().has_value());
}

TEST(TaskQueue, SeveralConsumersRunEveryTaskOnce) {
  TaskQueue queue;
  std::vector<std::thread> consumers;
  for (int t = 0; t < 4; ++t) consumers.emplace_back([&] { queue.run_until_stopped(); });
  std::vector<std::atomic<int>> runs(1000);
  for (auto& count : runs) {
    queue.push([&count] { ++count; });
  }
  queue.stop();
  for (auto& consumer : consumers) consumer.join();
  for (size_t i = 0; i < runs.size(); ++i) EXPECT_EQ(runs[i].load(), 1) << "task " << i;
}

}  // namespace
}  // namespace tandem
