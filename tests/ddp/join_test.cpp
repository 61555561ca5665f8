// Uneven inputs: ranks with 3, 5 and 0 batches train through Join without a hang, and every rank ends with
// the weights of one process that averaged, at each step, the gradients of the ranks that still had a batch.
#include <gtest/gtest.h>

#include <cstdlib>

#include "ddp_fixtures.h"
#include "support/processes.h"
#include "tandem/comm/process_group.h"
#include "tandem/ddp/join.h"
#include "tandem/nn/sync_batch_norm.h"
#include "tandem/util/error.h"

namespace tandem::testing {
namespace {

constexpr int kBatchesPerRank[] = {3, 5, 0};
constexpr int kWorld = 3;
constexpr int kMostBatches = 5;

Batch rank_batch(int rank, int step) {
  auto gen = generator(5000 + 10 * step + rank);
  return {torch::randn({4, 8}, gen), torch::randn({4, 4}, gen)};
}

// One process: step k's loss is the mean of the losses of the ranks that have a k-th batch.
std::vector<torch::Tensor> train_reference_uneven(const Scenario& s) {
  Net net = make_net(s, /*seed=*/7);
  auto optimizer = make_sgd(net->parameters());
  for (int step = 0; step < kMostBatches; ++step) {
    optimizer.zero_grad();
    torch::Tensor loss = torch::zeros({});
    int trained = 0;
    for (int r = 0; r < kWorld; ++r) {
      if (step >= kBatchesPerRank[r]) continue;
      const Batch batch = rank_batch(r, step);
      loss = loss + torch::mse_loss(net->forward(batch.x), batch.y);
      ++trained;
    }
    (loss / trained).backward();
    optimizer.step();
  }
  return snapshot(*net);
}

// `accumulate`: each step as two micro-batches, the first under no_sync, with an evaluation forward under no-grad
// in between; the gradient is the same as the whole batch's.
void check_join_rank(const ddp::DdpOptions& options, const char* label, bool accumulate = false) {
  InitOptions init;
  init.backend = "gloo";
  init.timeout = std::chrono::seconds(30);
  init_process_group(init);
  ASSERT_EQ(world_size(), kWorld);
  Scenario s;
  s.world = kWorld;
  s.options = options;
  Net net = make_net(s, /*seed=*/7 + rank());
  ddp::DistributedDataParallel<Net> model(net, default_group().communicator_ptr(), s.options);
  auto optimizer = make_sgd(model.parameters());
  ddp::Join join(model);
  for (int step = 0; step < kBatchesPerRank[rank()]; ++step) {
    const Batch batch = rank_batch(rank(), step);
    optimizer.zero_grad();
    if (accumulate) {
      {
        auto guard = model.no_sync();
        (torch::mse_loss(model(batch.x.narrow(0, 0, 2)), batch.y.narrow(0, 0, 2)) / 2).backward();
      }
      {
        torch::NoGradGuard evaluation;
        model(batch.x);
      }
      (torch::mse_loss(model(batch.x.narrow(0, 2, 2)), batch.y.narrow(0, 2, 2)) / 2).backward();
    } else {
      torch::mse_loss(model(batch.x), batch.y).backward();
    }
    optimizer.step();
  }
  int shadowed = 0;
  const int root = join.finish([&] { ++shadowed; });
  EXPECT_EQ(root, 1) << "rank 1 trained longest";
  EXPECT_EQ(shadowed, kMostBatches - kBatchesPerRank[rank()]) << "one shadow step per step of the others";
  const Difference d = compare(snapshot(*model.module()), train_reference_uneven(s));
  std::printf("[join parity] %s rank %d (%d batches): largest difference abs %.3g relative %.3g\n", label, rank(),
              kBatchesPerRank[rank()], d.max_abs, d.max_rel);
  EXPECT_LE(d.max_rel, 1e-5);
  destroy_process_group();
}

TEST(JoinWorker, SeveralBucketsAndReplicaChecks) {
  if (!is_worker_process()) GTEST_SKIP() << "runs only as a rank of Join";
  ddp::DdpOptions options;
  options.bucket_cap_mb = 300.0 / (1024 * 1024);
  options.first_bucket_cap_mb = 100.0 / (1024 * 1024);
  // Every forward compares the replicas of the ranks still training; the shadowing ones stay out.
  options.check_replicas_every = 1;
  check_join_rank(options, "small buckets, replica check");
}

TEST(JoinWorker, FindUnusedWithStaticGraph) {
  if (!is_worker_process()) GTEST_SKIP() << "runs only as a rank of Join";
  ddp::DdpOptions options;
  options.find_unused_parameters = true;
  options.static_graph = true;
  check_join_rank(options, "find_unused + static_graph");
}

TEST(JoinWorker, NoSyncMicroBatchesAndANoGradForward) {
  if (!is_worker_process()) GTEST_SKIP() << "runs only as a rank of Join";
  ddp::DdpOptions options;
  options.check_replicas_every = 1;
  check_join_rank(options, "no_sync + no-grad forward", /*accumulate=*/true);
}

void expect_ranks_succeeded(const std::vector<ProcessResult>& results) {
  ASSERT_EQ(results.size(), static_cast<size_t>(kWorld));
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_FALSE(results[r].timed_out) << "rank " << r << " hung:\n" << results[r].output;
    EXPECT_EQ(results[r].exit_code, 0) << "rank " << r << " output:\n" << results[r].output;
    const auto line = results[r].output.find("[join parity]");
    if (line != std::string::npos) {
      std::printf("%s\n", results[r].output.substr(line, results[r].output.find('\n', line) - line).c_str());
    }
  }
}

TEST(Join, RanksWithThreeFiveAndNoBatchesMatchOneProcess) {
  expect_ranks_succeeded(run_worker_ranks(kWorld, "JoinWorker.SeveralBucketsAndReplicaChecks", std::chrono::seconds(120)));
}

TEST(Join, UnevenRanksWithStaticGraphMatchOneProcess) {
  expect_ranks_succeeded(run_worker_ranks(kWorld, "JoinWorker.FindUnusedWithStaticGraph", std::chrono::seconds(120)));
}

TEST(Join, UnevenRanksAccumulatingUnderNoSyncMatchOneProcess) {
  expect_ranks_succeeded(run_worker_ranks(kWorld, "JoinWorker.NoSyncMicroBatchesAndANoGradForward", std::chrono::seconds(120)));
}

struct WithSyncBatchNormImpl : torch::nn::Module {
  WithSyncBatchNormImpl() {
    fc = register_module("fc", torch::nn::Linear(4, 4));
    norm = register_module("norm", nn::SyncBatchNorm(4));
  }
  torch::Tensor forward(torch::Tensor x) { return norm(fc(x)); }
  torch::nn::Linear fc{nullptr};
  nn::SyncBatchNorm norm{nullptr};
};
TORCH_MODULE(WithSyncBatchNorm);

TEST(Join, RefusesSyncBatchNormByName) {
  ddp::DistributedDataParallel<WithSyncBatchNorm> model(WithSyncBatchNorm(), nullptr);
  try {
    ddp::Join join(model);
    FAIL() << "Join accepted a model with SyncBatchNorm";
  } catch (const UnsupportedError& error) {
    EXPECT_NE(std::string(error.what()).find("SyncBatchNorm ('norm')"), std::string::npos) << error.what();
  }
}

TEST(Join, WorldOfOneFinishesAtOnce) {
  Scenario s;
  Net net = make_net(s, 7);
  ddp::DistributedDataParallel<Net> model(net, nullptr);
  ddp::Join join(model);
  bool shadowed = false;
  EXPECT_EQ(join.finish([&] { shadowed = true; }), 0);
  EXPECT_FALSE(shadowed);
}

}  // namespace
}  // namespace tandem::testing
