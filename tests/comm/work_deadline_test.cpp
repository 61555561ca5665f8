// The host-side deadline that gives nccl the failure model of gloo and mpi (comm/work_deadline.h), on the CPU:
// WorkDeadline over fake "is it done" predicates and a fake clock, then a fake device backend whose collectives,
// like NCCL's kernels, complete only once every rank has joined them, waited on through WorkDeadline as
// C10dCommunicator does for nccl. A rank that never joins must end in a TimeoutError naming it.
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <future>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "tandem/comm/communicator.h"
#include "tandem/comm/work_deadline.h"
#include "tandem/util/error.h"

namespace tandem::comm {
namespace {

using namespace std::chrono_literals;
using Clock = WorkDeadline::Clock;

// A clock that moves `step` forward each time it is read.
std::function<Clock::time_point()> stepping_clock(Clock::time_point start, std::chrono::milliseconds step) {
  auto reads = std::make_shared<int>(0);
  return [start, step, reads] { return start + step * (*reads)++; };
}

TEST(WorkDeadline, ReturnsOnceTheWorkIsDone) {
  const Clock::time_point start{};
  int polls = 0;
  WorkDeadline deadline("nccl all_reduce(sum)", start, 10s);
  deadline.wait([&] { return ++polls == 200; }, stepping_clock(start, 1ms));
  EXPECT_EQ(polls, 200) << "it polled past the moment the work was done";
}

TEST(WorkDeadline, ThrowsATimeoutOnceTheDeadlinePassesFirst) {
  const Clock::time_point start{};
  int polls = 0;
  WorkDeadline deadline("nccl barrier", start, 5s);
  try {
    deadline.wait([&] { return ++polls > 1000; }, stepping_clock(start, 1s));
    ADD_FAILURE() << "wait() returned for work that never completed";
  } catch (const CommError& error) {
    EXPECT_EQ(std::string(error.what()), "nccl barrier timed out: not complete 5 s after it started");
  }
  EXPECT_EQ(polls, 6) << "the clock read 0 s .. 5 s, one poll each";
}

// Collectives that complete only once every rank has started the same one, as NCCL's kernels do; the host
// learns it only by asking, as of a CUDA event.
struct FakeDevice {
  std::mutex mutex;
  std::map<int, int> started;  // collective index on a rank -> ranks that started it
  int world_size = 2;
};

class PolledWork : public Work {
 public:
  PolledWork(std::function<bool()> is_done, WorkDeadline deadline)
      : is_done_(std::move(is_done)), deadline_(std::move(deadline)) {}
  void wait() override { deadline_.wait(is_done_); }
  bool is_completed() override { return is_done_(); }
  void observe_completion(std::function<void()> observer) override { observer(); }

 private:
  std::function<bool()> is_done_;
  WorkDeadline deadline_;
};

class FakeDeviceBackend : public Communicator {
 public:
  FakeDeviceBackend(StorePtr store, int rank, std::shared_ptr<FakeDevice> device, std::chrono::milliseconds timeout)
      : Communicator("fake-device", std::move(store), rank, device->world_size, timeout, Capabilities{true, false, {}}),
        device_(std::move(device)) {}

 protected:
  WorkPtr start_all_reduce(torch::Tensor&, ReduceOp op) override { return start("all_reduce(" + to_string(op) + ")"); }
  WorkPtr start_broadcast(torch::Tensor&, int) override { return start("broadcast"); }
  WorkPtr start_all_gather(std::vector<torch::Tensor>&, const torch::Tensor&) override { return start("all_gather"); }
  WorkPtr start_barrier() override { return start("barrier"); }

 private:
  WorkPtr start(const std::string& operation) {
    const int index = issued_++;
    {
      std::lock_guard<std::mutex> lock(device_->mutex);
      ++device_->started[index];
    }
    auto is_done = [device = device_, index] {
      std::lock_guard<std::mutex> lock(device->mutex);
      return device->started[index] == device->world_size;
    };
    return std::make_shared<PolledWork>(is_done, WorkDeadline("fake-device " + operation, Clock::now(), timeout()));
  }

  std::shared_ptr<FakeDevice> device_;
  int issued_ = 0;
};

TEST(WorkDeadline, ADeviceCollectiveARankNeverJoinsTimesOutNamingThatRank) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  auto device = std::make_shared<FakeDevice>();
  std::promise<void> rank0_done;
  // Rank 1 joins the first all-reduce, then stays alive (its tracker keeps publishing) without the second.
  std::thread rank1([&] {
    FakeDeviceBackend communicator(store, 1, device, 2s);
    torch::Tensor values = torch::ones({4});
    communicator.all_reduce(values, ReduceOp::Sum)->wait();
    rank0_done.get_future().wait();
  });
  std::string message;
  {
    FakeDeviceBackend communicator(store, 0, device, 2s);
    torch::Tensor values = torch::ones({4});
    try {
      communicator.all_reduce(values, ReduceOp::Sum)->wait();
      communicator.all_reduce(values, ReduceOp::Avg)->wait();
    } catch (const TimeoutError& error) {
      message = error.what();
    }
  }
  rank0_done.set_value();
  rank1.join();
  std::printf("%s\n", message.c_str());
  EXPECT_NE(message.find("all_reduce(avg) #2 on rank 0/2 timed out after 2 s: rank(s) 1 never reached it"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("(fake-device all_reduce(avg) timed out: not complete 2 s after it started)"),
            std::string::npos)
      << message;
}

}  // namespace
}  // namespace tandem::comm
