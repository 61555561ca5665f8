// The communicator base, in front of a recording backend: what reaches a backend once the base has checked
// the arguments, emulated what the backend lacks (average, reduce-scatter, complex dtypes), and how a
// backend's failure reaches the caller. The real backends run the same emulations in collectives_test.cpp
// (gloo) and tests/mpi.
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <stdexcept>
#include <string>
#include <vector>

#include "tandem/comm/communicator.h"
#include "tandem/util/error.h"

namespace tandem {
namespace {

using comm::ReduceOp;
using comm::WorkPtr;
using torch::Tensor;

// A finished backend work, or one whose wait() throws `failure`.
class FinishedWork : public comm::Work {
 public:
  explicit FinishedWork(std::function<void()> failure = nullptr) : failure_(std::move(failure)) {}
  void wait() override {
    if (failure_) failure_();
  }
  bool is_completed() override { return true; }
  void observe_completion(std::function<void()> observer) override { observer(); }

 private:
  std::function<void()> failure_;
};

// Rank 0 of a world of two in which the other rank always holds the same values as this one, so that a sum is
// twice this rank's tensor. Records what the base hands it.
class MirrorBackend : public comm::Communicator {
 public:
  static constexpr int kWorld = 2;

  struct Call {
    std::string collective;
    ReduceOp op = ReduceOp::Sum;
    torch::ScalarType dtype = torch::kFloat;
    int64_t numel = 0;
  };

  explicit MirrorBackend(Capabilities capabilities = {})
      : Communicator("mirror", c10::make_intrusive<c10d::HashStore>(), 0, kWorld, std::chrono::seconds(2),
                     capabilities) {}

  static Capabilities native_average_and_reduce_scatter() { return {true, true, std::nullopt}; }
  static Capabilities cuda_only() { return {false, false, torch::kCUDA}; }

  std::vector<Call> calls;
  // When set, the backend's work fails with this in wait().
  std::function<void()> failure;

 protected:
  WorkPtr start_all_reduce(Tensor& tensor, ReduceOp op) override {
    record("all_reduce", op, tensor);
    if (op == ReduceOp::Sum) tensor.mul_(kWorld);
    return work();
  }
  WorkPtr start_broadcast(Tensor& tensor, int) override {
    record("broadcast", ReduceOp::Sum, tensor);
    return work();
  }
  WorkPtr start_all_gather(std::vector<Tensor>& outputs, const Tensor& input) override {
    record("all_gather", ReduceOp::Sum, input);
    for (auto& output : outputs) output.copy_(input.view(output.sizes()));
    return work();
  }
  WorkPtr start_reduce_scatter(Tensor& output, const Tensor& input, ReduceOp op) override {
    record("reduce_scatter", op, input);
    Tensor mine = input.reshape({kWorld, -1})[rank()].view(output.sizes());
    output.copy_(op == ReduceOp::Sum ? mine * kWorld : mine);
    return work();
  }
  WorkPtr start_barrier() override {
    calls.push_back({"barrier"});
    return work();
  }

 private:
  void record(const std::string& collective, ReduceOp op, const Tensor& tensor) {
    calls.push_back({collective, op, tensor.scalar_type(), tensor.numel()});
  }
  WorkPtr work() { return std::make_shared<FinishedWork>(failure); }
};

template <typename Exception>
std::string message_of(const std::function<void()>& run) {
  try {
    run();
  } catch (const Exception& error) {
    return error.what();
  } catch (const std::exception& error) {
    return std::string("wrong exception: ") + error.what();
  }
  return "no exception";
}

TEST(CommunicatorChecks, RefuseBadArgumentsBeforeTheBackendSeesThem) {
  MirrorBackend comm;
  Tensor tensor = torch::ones({4});
  EXPECT_NE(message_of<InvalidArgument>([&] { comm.broadcast(tensor, 2); })
                .find("broadcast root 2 is outside world size 2"),
            std::string::npos);
  EXPECT_THROW(comm.broadcast(tensor, -1), InvalidArgument);

  std::vector<Tensor> one_output{torch::empty({4})};
  EXPECT_NE(message_of<InvalidArgument>([&] { comm.all_gather(one_output, tensor); })
                .find("all_gather needs 2 output tensors (one per rank), got 1"),
            std::string::npos);
  std::vector<Tensor> short_output{torch::empty({4}), torch::empty({3})};
  EXPECT_THROW(comm.all_gather(short_output, tensor), InvalidArgument);
  std::vector<Tensor> integer_output{torch::empty({4}), torch::empty({4}, torch::kInt64)};
  EXPECT_NE(message_of<InvalidArgument>([&] { comm.all_gather(integer_output, tensor); }).find("got 4 of Long"),
            std::string::npos);

  Tensor output = torch::empty({3});
  EXPECT_NE(message_of<InvalidArgument>([&] { comm.reduce_scatter(output, tensor); })
                .find("reduce_scatter input has 4 elements; it must be world size 2 x output's 3"),
            std::string::npos);
  Tensor integer_half = torch::empty({2}, torch::kInt64);
  EXPECT_NE(message_of<InvalidArgument>([&] { comm.reduce_scatter(integer_half, tensor); })
                .find("reduce_scatter input is Float but output is Long"),
            std::string::npos);

  Tensor complex = torch::ones({4}, torch::kComplexFloat);
  EXPECT_NE(message_of<InvalidArgument>([&] { comm.all_reduce(complex, ReduceOp::Max); })
                .find("complex numbers have no order"),
            std::string::npos);
  EXPECT_TRUE(comm.calls.empty()) << comm.calls.size() << " calls reached the backend";
}

TEST(CommunicatorChecks, RefuseTensorsOnADeviceTheBackendDoesNotTake) {
  MirrorBackend comm(MirrorBackend::cuda_only());
  Tensor on_host = torch::ones({4});
  EXPECT_NE(message_of<UnsupportedError>([&] { comm.all_reduce(on_host, ReduceOp::Sum); })
                .find("backend mirror does not support cpu tensors in all_reduce(sum); move them to the GPU"),
            std::string::npos);
  EXPECT_TRUE(comm.calls.empty());
}

TEST(CommunicatorAverage, FloatingPointIsDividedBeforeTheSum) {
  MirrorBackend comm;
  Tensor values = torch::tensor({2.0, 3.0, 5.0});
  comm::WorkPtr work = comm.all_reduce(values, ReduceOp::Avg);
  // Divided before the backend's sum: the backend's part has already run, and nothing is left to do after it.
  ASSERT_EQ(comm.calls.size(), 1u);
  EXPECT_EQ(comm.calls[0].op, ReduceOp::Sum);
  work->wait();
  EXPECT_TRUE(torch::equal(values, torch::tensor({2.0, 3.0, 5.0})));
}

TEST(CommunicatorAverage, IntegersAreDividedAfterTheSumTruncating) {
  MirrorBackend comm;
  Tensor counts = torch::tensor({3, 5, -7}, torch::kInt64);
  comm::WorkPtr work = comm.all_reduce(counts, ReduceOp::Avg);
  EXPECT_EQ(comm.calls.at(0).op, ReduceOp::Sum);
  EXPECT_TRUE(work->is_completed());  // which finishes the division
  EXPECT_TRUE(torch::equal(counts, torch::tensor({3, 5, -7}, torch::kInt64)));
}

TEST(CommunicatorAverage, ComplexTravelsAsRealPairsAndIsDividedFirst) {
  MirrorBackend comm;
  Tensor values = torch::complex(torch::tensor({1.0f, -2.0f}), torch::tensor({4.0f, 0.5f}));
  const Tensor original = values.clone();
  comm.all_reduce(values, ReduceOp::Avg)->wait();
  ASSERT_EQ(comm.calls.size(), 1u);
  EXPECT_EQ(comm.calls[0].dtype, torch::kFloat);
  EXPECT_EQ(comm.calls[0].numel, 4);
  EXPECT_TRUE(torch::equal(values, original));
  comm.all_reduce(values, ReduceOp::Sum)->wait();
  EXPECT_TRUE(torch::equal(values, original * 2));
}

TEST(CommunicatorAverage, NativeAverageReachesTheBackendAsItIs) {
  MirrorBackend comm(MirrorBackend::native_average_and_reduce_scatter());
  Tensor values = torch::tensor({2.0, 3.0});
  comm.all_reduce(values, ReduceOp::Avg)->wait();
  EXPECT_EQ(comm.calls.at(0).op, ReduceOp::Avg);
  EXPECT_TRUE(torch::equal(values, torch::tensor({2.0, 3.0})));
}

TEST(CommunicatorReduceScatter, EmulatedByAnAllReduceOfTheWholeInput) {
  MirrorBackend comm;
  const Tensor input = torch::arange(6, torch::kInt64);
  Tensor output = torch::empty({3}, torch::kInt64);
  comm.reduce_scatter(output, input, ReduceOp::Sum)->wait();
  ASSERT_EQ(comm.calls.size(), 1u);
  EXPECT_EQ(comm.calls[0].collective, "all_reduce");
  EXPECT_EQ(comm.calls[0].numel, 6);
  EXPECT_TRUE(torch::equal(output, torch::tensor({0, 2, 4}, torch::kInt64)));
  EXPECT_TRUE(torch::equal(input, torch::arange(6, torch::kInt64))) << "the caller's input was changed";

  comm.reduce_scatter(output, input + 1, ReduceOp::Avg)->wait();
  EXPECT_TRUE(torch::equal(output, torch::tensor({1, 2, 3}, torch::kInt64)));
}

TEST(CommunicatorReduceScatter, NativeWhereTheBackendHasOneAverageStillEmulatedForIntegers) {
  MirrorBackend comm({/*average=*/false, /*reduce_scatter=*/true, std::nullopt});
  const Tensor input = torch::tensor({1.0, 3.0, 5.0, 7.0}, torch::kDouble);
  Tensor output = torch::empty({2}, torch::kDouble);
  comm.reduce_scatter(output, input, ReduceOp::Avg)->wait();
  ASSERT_EQ(comm.calls.size(), 1u);
  EXPECT_EQ(comm.calls[0].collective, "reduce_scatter");
  EXPECT_EQ(comm.calls[0].op, ReduceOp::Sum);
  EXPECT_TRUE(torch::equal(output, torch::tensor({1.0, 3.0}, torch::kDouble)));
  EXPECT_TRUE(torch::equal(input, torch::tensor({1.0, 3.0, 5.0, 7.0}, torch::kDouble)))
      << "the caller's input was divided";

  Tensor counts = torch::empty({2}, torch::kInt32);
  comm.reduce_scatter(counts, torch::tensor({3, 5, 7, 9}, torch::kInt32), ReduceOp::Avg)->wait();
  EXPECT_TRUE(torch::equal(counts, torch::tensor({3, 5}, torch::kInt32)));
}

TEST(CommunicatorFailures, ABackendTimeoutNamesTheCollectiveAndTheMissingRank) {
  MirrorBackend comm;
  comm.failure = [] { throw std::runtime_error("Timed out waiting 2000ms for recv operation to complete"); };
  comm.barrier();
  Tensor values = torch::ones({2});
  comm::WorkPtr work = comm.all_reduce(values, ReduceOp::Sum);
  const std::string message = message_of<TimeoutError>([&] { work->wait(); });
  EXPECT_NE(message.find("all_reduce(sum) #2 on rank 0/2 timed out after 2 s"), std::string::npos) << message;
  // Rank 1 of this test never existed, so it never published a heartbeat in the store.
  EXPECT_NE(message.find("rank(s) 1"), std::string::npos) << message;
}

TEST(CommunicatorFailures, ThisRanksOwnLimitsPassUnchanged) {
  MirrorBackend comm;
  comm.failure = [] { throw UnsupportedError("backend mirror does not support this"); };
  Tensor values = torch::ones({2});
  EXPECT_EQ(message_of<UnsupportedError>([&] { comm.all_reduce(values, ReduceOp::Sum)->wait(); }),
            "backend mirror does not support this");
}

}  // namespace
}  // namespace tandem
