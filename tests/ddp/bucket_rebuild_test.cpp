// Buckets are rebuilt once, after the first iteration, in the order backward produced the gradients (rank 0's),
// and static_graph drops the parameters the first iteration left unused.
#include <gtest/gtest.h>

#include <ATen/Parallel.h>

#include <mutex>

#include "ddp_fixtures.h"
#include "support/thread_ranks.h"
#include "tandem/util/error.h"

namespace tandem::testing {
namespace {

// Registered first, second, third but applied third, second, first: backward produces first's gradients
// first, the opposite of the registration order the initial buckets follow.
struct ReorderedImpl : torch::nn::Module {
  ReorderedImpl() {
    first = register_module("first", torch::nn::Linear(8, 4));
    second = register_module("second", torch::nn::Linear(8, 8));
    third = register_module("third", torch::nn::Linear(8, 8));
  }
  torch::Tensor forward(torch::Tensor x) { return first(torch::tanh(second(torch::tanh(third(x))))); }
  torch::nn::Linear first{nullptr}, second{nullptr}, third{nullptr};
};
TORCH_MODULE(Reordered);

// The layer of each bucketed parameter, in launch order ("first" for "first.weight").
std::vector<std::string> layers_in_bucket_order(ddp::Reducer& reducer) {
  const std::vector<std::string> names = reducer.parameter_names();
  std::vector<std::string> layers;
  for (const auto& layout : reducer.bucket_layouts()) {
    for (size_t index : layout.params) layers.push_back(names[index].substr(0, names[index].find('.')));
  }
  return layers;
}

void train_step(ddp::DistributedDataParallel<Reordered>& model, torch::optim::SGD& optimizer, int rank, int step) {
  auto gen = generator(100 * step + rank);
  optimizer.zero_grad();
  torch::mse_loss(model(torch::randn({4, 8}, gen)), torch::randn({4, 4}, gen)).backward();
  optimizer.step();
}

TEST(BucketRebuild, BucketsFollowTheGradientOrderOfTheFirstIteration) {
  std::mutex mutex;
  std::vector<std::vector<std::string>> before(2), after(2);
  run_thread_ranks(2, [&](int rank, comm::Communicator& communicator) {
    ddp::DdpOptions options;
    options.first_bucket_cap_mb = options.bucket_cap_mb = 1.0 / (1024 * 1024);  // one parameter per bucket
    ddp::DistributedDataParallel<Reordered> model(Reordered(), borrow(communicator), options);
    torch::optim::SGD optimizer(model.parameters(), 0.1);
    const auto initial = layers_in_bucket_order(model.reducer());
    train_step(model, optimizer, rank, 0);
    train_step(model, optimizer, rank, 1);  // its forward rebuilds
    train_step(model, optimizer, rank, 2);
    std::lock_guard<std::mutex> lock(mutex);
    before[rank] = initial;
    after[rank] = layers_in_bucket_order(model.reducer());
  });
  const std::vector<std::string> registration_reversed{"third", "third", "second", "second", "first", "first"};
  const std::vector<std::string> gradient_order{"first", "first", "second", "second", "third", "third"};
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(before[rank], registration_reversed) << "rank " << rank;
    EXPECT_EQ(after[rank], gradient_order) << "rank " << rank;
  }
}

// The rebuild happens between iterations and must leave training exactly as without it.
TEST(BucketRebuild, TrainingMatchesOneProcessAcrossTheRebuildWithGradientsAsBucketViews) {
  Scenario s;
  s.options.first_bucket_cap_mb = 100.0 / (1024 * 1024);
  s.options.bucket_cap_mb = 300.0 / (1024 * 1024);
  s.options.gradient_as_bucket_view = true;
  const auto expected = train_reference(s);
  run_thread_ranks(s.world, [&](int rank, comm::Communicator& communicator) {
    EXPECT_LE(compare(train_ddp(s, rank, borrow(communicator)), expected).max_rel, 1e-5) << "rank " << rank;
  });
}

TEST(BucketPlan, RanksThatFillTheCoresLeaveNoneForCommunication) {
  EXPECT_TRUE(ddp::ranks_fill_cores(2, 1, 2));
  EXPECT_TRUE(ddp::ranks_fill_cores(1, 4, 2));
  EXPECT_FALSE(ddp::ranks_fill_cores(2, 1, 4));
  EXPECT_FALSE(ddp::ranks_fill_cores(2, 3, 8));
  EXPECT_GE(ddp::usable_cores(), 1);
}

// Thread ranks of this process: LOCAL_WORLD_SIZE is unset, so this host holds one rank of get_num_threads()
// threads for the plan. Rank 0's decision holds on every rank.
TEST(BucketPlan, AdaptToHostMakesOneBucketWhereTheRanksFillTheCoresAndKeepsTheCapsElsewhere) {
  const bool one_bucket = ddp::ranks_fill_cores(1, at::get_num_threads(), ddp::usable_cores());
  std::mutex mutex;
  std::vector<size_t> adapted(2), capped(2);
  run_thread_ranks(2, [&](int rank, comm::Communicator& communicator) {
    ddp::DdpOptions options;
    options.first_bucket_cap_mb = options.bucket_cap_mb = 1.0 / (1024 * 1024);  // one parameter per bucket
    ddp::DistributedDataParallel<Reordered> caps(Reordered(), borrow(communicator), options);
    options.bucket_plan = ddp::BucketPlan::kAdaptToHost;
    ddp::DistributedDataParallel<Reordered> adapt(Reordered(), borrow(communicator), options);
    std::lock_guard<std::mutex> lock(mutex);
    capped[rank] = caps.reducer().bucket_layouts().size();
    adapted[rank] = adapt.reducer().bucket_layouts().size();
  });
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(capped[rank], 6u);
    EXPECT_EQ(adapted[rank], one_bucket ? 1u : 6u) << "rank " << rank << ", one bucket expected: " << one_bucket;
  }
}

TEST(StaticGraph, UnusedParametersLeaveTheBucketsAndTrainingStillMatches) {
  Scenario s;
  s.with_extra = true;  // `extra` is registered, never used
  s.options.find_unused_parameters = true;
  s.options.static_graph = true;
  const auto expected = train_reference(s);
  std::mutex mutex;
  size_t bucketed = 0;
  run_thread_ranks(s.world, [&](int rank, comm::Communicator& communicator) {
    const auto got = train_ddp(s, rank, borrow(communicator));
    EXPECT_LE(compare(got, expected).max_rel, 1e-5) << "rank " << rank;
  });
  // The buckets after the rebuild, seen from a model trained two steps.
  run_thread_ranks(s.world, [&](int rank, comm::Communicator& communicator) {
    Net net = make_net(s, 7);
    ddp::DistributedDataParallel<Net> model(net, borrow(communicator), s.options);
    auto optimizer = make_sgd(model.parameters());
    for (int step = 0; step < 2; ++step) {
      const Batch batch = full_batch(s, step);
      optimizer.zero_grad();
      torch::mse_loss(model(batch.x.narrow(0, rank * 4, 4)), batch.y.narrow(0, rank * 4, 4)).backward();
      optimizer.step();
    }
    size_t count = 0;
    for (const auto& layout : model.reducer().bucket_layouts()) count += layout.params.size();
    std::lock_guard<std::mutex> lock(mutex);
    bucketed = count;
  });
  EXPECT_EQ(bucketed, 6u) << "fc1, fc2, fc3 weights and biases; extra's two left out";
}

TEST(StaticGraph, AParameterThatStartsGettingGradientsLaterIsAnErrorNamingIt) {
  Scenario s;
  s.with_extra = true;
  s.options.find_unused_parameters = true;
  s.options.static_graph = true;
  run_thread_ranks(s.world, [&](int rank, comm::Communicator& communicator) {
    Net net = make_net(s, 7);
    ddp::DistributedDataParallel<Net> model(net, borrow(communicator), s.options);
    auto optimizer = make_sgd(model.parameters());
    auto step = [&](int index) {
      const Batch batch = full_batch(s, index);
      optimizer.zero_grad();
      torch::mse_loss(model(batch.x.narrow(0, rank * 4, 4)), batch.y.narrow(0, rank * 4, 4)).backward();
      optimizer.step();
    };
    step(0);
    step(1);
    net->use_extra = true;
    try {
      step(2);
      ADD_FAILURE() << "rank " << rank << ": a gradient for a parameter static_graph left out went unnoticed";
    } catch (const std::exception& error) {
      EXPECT_NE(std::string(error.what()).find("'extra."), std::string::npos) << error.what();
      EXPECT_NE(std::string(error.what()).find("static_graph"), std::string::npos) << error.what();
    }
  });
}

}  // namespace
}  // namespace tandem::testing
