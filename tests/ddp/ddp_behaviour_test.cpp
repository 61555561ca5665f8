// What DDP does besides matching a single process: bucket layout, communication overlapping backward, clear
// errors on every rank (never a hang) for mismatched models and unused parameters, buffer broadcast.
#include <gtest/gtest.h>

#include <array>
#include <mutex>
#include <string>

#include "ddp_fixtures.h"
#include "support/thread_ranks.h"
#include "tandem/util/error.h"

namespace tandem::testing {
namespace {

TEST(BucketAssignment, ReverseOrderFirstBucketSmallerDtypesApart) {
  // Four float parameters of 1000 elements (4000 bytes) and one double in the middle.
  std::vector<torch::Tensor> params = {torch::zeros({1000}), torch::zeros({10, 100}), torch::zeros({5}, torch::kDouble),
                                       torch::zeros({1000}), torch::zeros({1000})};
  auto buckets = ddp::assign_buckets(params, /*first=*/4000, /*later=*/8000);
  ASSERT_EQ(buckets.size(), 4u);
  EXPECT_EQ(buckets[0].params, (std::vector<size_t>{4}));  // first bucket closes at 4000 bytes
  EXPECT_EQ(buckets[1].params, (std::vector<size_t>{3, 1}));
  EXPECT_EQ(buckets[1].offsets, (std::vector<int64_t>{0, 1000}));
  EXPECT_EQ(buckets[1].numel, 2000);
  EXPECT_EQ(buckets[2].params, (std::vector<size_t>{2}));
  EXPECT_EQ(buckets[2].dtype, torch::kDouble);
  EXPECT_EQ(buckets[3].params, (std::vector<size_t>{0}));
}

// Records, per rank, the order in which buckets were handed to communication and gradients were produced.
class RecordingHook : public ddp::CommHook {
 public:
  explicit RecordingHook(std::vector<std::string>& events) : events_(events) {}
  std::string name() const override { return "recording"; }
  comm::WorkPtr launch(comm::Communicator& communicator, const ddp::GradBucket& bucket) override {
    events_.push_back("launch " + std::to_string(bucket.index));
    return inner_->launch(communicator, bucket);
  }

 private:
  std::vector<std::string>& events_;
  ddp::CommHookPtr inner_ = ddp::make_average_hook();
};

TEST(DdpOverlap, FirstBucketLaunchesBeforeBackwardProducesTheLastGradient) {
  run_thread_ranks(2, [](int rank, comm::Communicator& communicator) {
    std::vector<std::string> events;
    Scenario s;
    s.options.bucket_cap_mb = 1.0 / (1024 * 1024);  // every parameter its own bucket
    s.options.first_bucket_cap_mb = 1.0 / (1024 * 1024);
    s.options.comm_hook = std::make_shared<RecordingHook>(events);
    Net net = make_net(s, 7);
    ddp::DistributedDataParallel<Net> model(net, borrow(communicator), s.options);
    const size_t buckets = model.reducer().bucket_layouts().size();
    ASSERT_EQ(buckets, 6u);
    // fc1's gradients are the last backward produces (it is the first layer).
    net->fc1->weight.register_hook([&events](torch::Tensor grad) { events.push_back("grad fc1.weight"); });
    Batch batch = full_batch(s, 0);
    torch::mse_loss(model(batch.x.narrow(0, rank * 4, 4)), batch.y.narrow(0, rank * 4, 4)).backward();
    events.push_back("backward returned");

    auto at = [&](const std::string& event) {
      return std::find(events.begin(), events.end(), event) - events.begin();
    };
    EXPECT_LT(at("launch 0"), at("grad fc1.weight"));
    EXPECT_LT(at("launch " + std::to_string(buckets - 1)), at("backward returned"));
    // Every bucket exactly once, in order.
    std::vector<std::string> launches;
    for (const auto& e : events) {
      if (e.rfind("launch", 0) == 0) launches.push_back(e);
    }
    ASSERT_EQ(launches.size(), buckets);
    for (size_t b = 0; b < buckets; ++b) EXPECT_EQ(launches[b], "launch " + std::to_string(b));
  });
}

// Runs body on `world` thread ranks and returns each rank's InvalidArgument message ("" if none was thrown).
template <typename Body>
std::vector<std::string> errors_per_rank(int world, Body body) {
  std::vector<std::string> messages(world);
  run_thread_ranks(world, [&](int rank, comm::Communicator& communicator) {
    try {
      body(rank, communicator);
    } catch (const InvalidArgument& error) {
      messages[rank] = error.what();
    }
  }, std::chrono::seconds(20));
  return messages;
}

TEST(DdpErrors, MismatchedModelsFailFastNamingTheParameter) {
  auto messages = errors_per_rank(3, [](int rank, comm::Communicator& communicator) {
    Scenario s;
    Net net = make_net(s, 7, /*hidden=*/rank == 1 ? 17 : 16);
    ddp::DistributedDataParallel<Net> model(net, borrow(communicator), s.options);
  });
  for (int r = 0; r < 3; ++r) {
    std::printf("[rank %d] %s\n", r, messages[r].c_str());
    EXPECT_NE(messages[r].find("fc1.weight"), std::string::npos) << messages[r];
    EXPECT_NE(messages[r].find("ranks [1]"), std::string::npos) << messages[r];
    EXPECT_NE(messages[r].find("ranks [0, 2]"), std::string::npos) << messages[r];
  }
}

TEST(DdpErrors, MismatchedOptionsFailFast) {
  auto messages = errors_per_rank(2, [](int rank, comm::Communicator& communicator) {
    Scenario s;
    s.options.find_unused_parameters = rank == 0;
    ddp::DistributedDataParallel<Net> model(make_net(s, 7), borrow(communicator), s.options);
  });
  for (const auto& m : messages) EXPECT_NE(m.find("find_unused_parameters"), std::string::npos) << m;
}

TEST(DdpErrors, UnusedParameterWithoutTheOptionNamesItOnEveryRank) {
  auto messages = errors_per_rank(2, [](int rank, comm::Communicator& communicator) {
    Scenario s;
    s.with_extra = true;
    Net net = make_net(s, 7);
    ddp::DistributedDataParallel<Net> model(net, borrow(communicator), s.options);
    Batch batch = full_batch(s, 0);
    torch::mse_loss(model(batch.x.narrow(0, rank * 4, 4)), batch.y.narrow(0, rank * 4, 4)).backward();
  });
  for (const auto& m : messages) {
    std::printf("%s\n", m.c_str());
    EXPECT_NE(m.find("extra.weight"), std::string::npos) << m;
    EXPECT_NE(m.find("find_unused_parameters"), std::string::npos) << m;
  }
}

TEST(DdpErrors, ParameterUnusedOnOneRankOnlyFailsEveryRankInsteadOfHanging) {
  auto messages = errors_per_rank(2, [](int rank, comm::Communicator& communicator) {
    Scenario s;
    s.with_extra = true;
    Net net = make_net(s, 7);
    net->use_extra = rank == 0;  // rank 1 never touches `extra`
    ddp::DistributedDataParallel<Net> model(net, borrow(communicator), s.options);
    Batch batch = full_batch(s, 0);
    torch::mse_loss(model(batch.x.narrow(0, rank * 4, 4)), batch.y.narrow(0, rank * 4, 4)).backward();
  });
  std::printf("[rank 0] %s\n[rank 1] %s\n", messages[0].c_str(), messages[1].c_str());
  EXPECT_NE(messages[1].find("extra.weight"), std::string::npos) << messages[1];
  EXPECT_NE(messages[0].find("ranks [1]"), std::string::npos) << messages[0];
}

TEST(DdpBuffers, FollowRankZeroAtEachSynchronisedForward) {
  run_thread_ranks(2, [](int rank, comm::Communicator& communicator) {
    torch::nn::Sequential net(torch::nn::Linear(3, 3), torch::nn::BatchNorm1d(3));
    ddp::DistributedDataParallel<torch::nn::Sequential> model(net, borrow(communicator));
    model.eval();  // BatchNorm leaves its statistics alone, so what we see is only the broadcast
    // named_buffers() returns its dictionary by value: a reference into it would dangle once the statement ends
    // (it read freed memory, and segfaulted once the heap's layout changed); a Tensor shares the buffer's storage.
    torch::Tensor running_mean = *net->named_buffers().find("1.running_mean");
    {
      torch::NoGradGuard no_grad;
      running_mean.fill_(rank + 1.0);
    }
    {
      auto guard = model.no_sync();  // no synchronisation, no broadcast
      model(torch::ones({2, 3}));
    }
    EXPECT_EQ(running_mean[0].item<float>(), rank + 1.0f);
    model(torch::ones({2, 3}));
    EXPECT_EQ(running_mean[0].item<float>(), 1.0f);
  });
}

TEST(DdpCommHook, Fp16CompressionAveragesAGradientBeyondFloat16sRange) {
  run_thread_ranks(2, [](int rank, comm::Communicator& communicator) {
    // Rank 0's gradient is above float16's largest value (65504); the average of the two ranks' is not.
    torch::Tensor buffer = torch::full({16}, rank == 0 ? 70000.0f : 0.0f);
    ddp::make_fp16_compress_hook()->launch(communicator, ddp::GradBucket{0, 1, buffer, {}})->wait();
    EXPECT_TRUE(torch::allclose(buffer, torch::full({16}, 35000.0f), 1e-3)) << buffer[0].item<float>();
  });
}

TEST(DdpCommHook, Bf16CompressionIsCloseWhereTheBackendHasBf16) {
  Scenario s;
  s.steps = 5;
  s.options.comm_hook = ddp::make_bf16_compress_hook();
  const auto expected = train_reference(s);
  std::vector<std::string> failures(2);
  run_thread_ranks(2, [&](int rank, comm::Communicator& communicator) {
    try {
      const Difference d = compare(train_ddp(s, rank, borrow(communicator)), expected);
      if (rank == 0) std::printf("[bf16 hook] largest difference abs %.3g relative %.3g\n", d.max_abs, d.max_rel);
      EXPECT_LT(d.max_rel, 2e-2);
    } catch (const UnsupportedError& error) {
      failures[rank] = error.what();
    }
  });
  // LibTorch 1.13's Gloo has no bfloat16 reduction; then every rank must get an error that says so, rather
  // than one blaming a peer.
  if (failures[0].empty() && failures[1].empty()) return;
  for (const auto& f : failures) EXPECT_NE(f.find("does not support BFloat16"), std::string::npos) << f;
}

}  // namespace
}  // namespace tandem::testing
