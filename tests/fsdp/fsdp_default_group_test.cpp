// FullyShardedDataParallel built without a communicator runs on the default group of init_process_group(), as
// DistributedDataParallel does: on 2 real processes it shards over both and trains to the DDP run's weights.
#include <gtest/gtest.h>

#include <cstdio>

#include "fsdp_fixtures.h"
#include "support/processes.h"
#include "tandem/comm/process_group.h"

namespace tandem::testing {
namespace {

TEST(FsdpDefaultGroupWorker, TrainsAsDdpOnTheDefaultGroup) {
  if (!is_worker_process()) GTEST_SKIP() << "runs only as a rank of FsdpDefaultGroup";
  InitOptions init;
  init.backend = "gloo";
  init.timeout = std::chrono::seconds(30);
  init_process_group(init);
  FsdpScenario s;
  s.world = world_size();
  s.steps = 3;
  fsdp::FullyShardedDataParallel<nn::CnnNet> sharded(make_cnn(7 + rank()));
  EXPECT_EQ(sharded.sharded().communicator(), &default_group().communicator());
  for (const auto& unit : sharded.sharded().units()) EXPECT_EQ(unit->shard().numel() * 2, unit->padded_numel());
  auto optimizer = make_optimizer(s, sharded.parameters());
  train_steps(s, rank(), sharded, *optimizer, [] {});
  const NamedTensors fsdp_weights = sharded.full_parameters();

  ddp::DistributedDataParallel<nn::CnnNet> replicated(make_cnn(7 + rank()));
  auto ddp_optimizer = make_optimizer(s, replicated.parameters());
  train_steps(s, rank(), replicated, *ddp_optimizer, [] {});
  NamedTensors ddp_weights;
  for (const auto& entry : replicated.module()->named_parameters()) {
    ddp_weights.emplace_back(entry.key(), entry.value().detach().clone());
  }
  const double difference = relative_l2(fsdp_weights, ddp_weights);
  std::printf("[fsdp default group] rank %d: relative L2 from DDP %.3g\n", rank(), difference);
  EXPECT_LE(difference, kFsdpRelativeTolerance);
  destroy_process_group();
}

TEST(FsdpDefaultGroup, WrapsWithoutACommunicatorAsDdpDoes) {
  const auto results = run_worker_ranks(2, "FsdpDefaultGroupWorker.TrainsAsDdpOnTheDefaultGroup", std::chrono::seconds(60));
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_FALSE(results[r].timed_out) << "rank " << r << " hung:\n" << results[r].output;
    EXPECT_EQ(results[r].exit_code, 0) << "rank " << r << " output:\n" << results[r].output;
  }
}

}  // namespace
}  // namespace tandem::testing
