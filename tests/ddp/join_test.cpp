// Uneven inputs: ranks with 3, 5 and 0 batches train through Join without a hang, and every rank ends with
// the weights of one process that averaged, at each step, the gradients of the ranks that still had a batch;
// BatchNorm's statistics follow the ranks still training; over two epochs, the ranks that shadowed keep the
// same optimizer state as the others.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cstdlib>
#include <memory>
#include <string>

#include "ddp_fixtures.h"
#include "support/processes.h"
#include "tandem/comm/process_group.h"
#include "tandem/ddp/join.h"
#include "tandem/ddp/replica_sync.h"
#include "tandem/nn/sync_batch_norm.h"
#include "tandem/util/compat.h"
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

void expect_join_ranks_succeeded(const std::vector<ProcessResult>& results) {
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
  expect_join_ranks_succeeded(run_worker_ranks(kWorld, "JoinWorker.SeveralBucketsAndReplicaChecks", std::chrono::seconds(120)));
}

TEST(Join, UnevenRanksWithStaticGraphMatchOneProcess) {
  expect_join_ranks_succeeded(run_worker_ranks(kWorld, "JoinWorker.FindUnusedWithStaticGraph", std::chrono::seconds(120)));
}

TEST(Join, UnevenRanksAccumulatingUnderNoSyncMatchOneProcess) {
  expect_join_ranks_succeeded(run_worker_ranks(kWorld, "JoinWorker.NoSyncMicroBatchesAndANoGradForward", std::chrono::seconds(120)));
}

// --- Buffers under Join: BatchNorm's running statistics ----------------------------------------------------
// Rank 0 runs out of batches first. Every step's statistics must come from a batch of that step (the highest
// rank's that had one), never stay as rank 0 left them.

constexpr int kNormBatchesPerRank[] = {2, 4, 3};
constexpr int kNormMostBatches = 4;

struct NormNetImpl : torch::nn::Module {
  NormNetImpl() {
    fc = register_module("fc", torch::nn::Linear(8, 6));
    norm = register_module("norm", torch::nn::BatchNorm1d(6));
    out = register_module("out", torch::nn::Linear(6, 4));
  }
  torch::Tensor forward(torch::Tensor x) { return out(torch::tanh(norm(fc(x)))); }
  torch::nn::Linear fc{nullptr}, out{nullptr};
  torch::nn::BatchNorm1d norm{nullptr};
};
TORCH_MODULE(NormNet);

NormNet make_norm_net(uint64_t seed) {
  NormNet net;
  torch::NoGradGuard no_grad;
  auto gen = generator(seed);
  for (auto& p : net->parameters()) p.copy_(torch::randn(p.sizes(), gen) * 0.5);
  return net;
}

Batch norm_batch(int rank, int step) {
  const Batch batch = rank_batch(rank, step);
  return {batch.x * 2 + 1, batch.y};  // statistics far from BatchNorm's initial (0, 1)
}

std::vector<torch::Tensor> buffers_of(torch::nn::Module& module) {
  std::vector<torch::Tensor> values;
  for (auto& b : module.buffers()) values.push_back(b.detach().clone());
  return values;
}

void set_buffers(torch::nn::Module& module, const std::vector<torch::Tensor>& values) {
  torch::NoGradGuard no_grad;
  auto buffers = module.buffers();
  for (size_t i = 0; i < buffers.size(); ++i) buffers[i].copy_(values[i]);
}

struct ParametersAndBuffers {
  std::vector<torch::Tensor> parameters, buffers;
};

// One process: step k averages the losses of the ranks with a k-th batch; each of those batches is normalised
// by its own statistics, and the running statistics take step k's batch of the highest such rank. (Each batch's
// backward runs before the statistics are reset for the next: BatchNorm's backward reads them.)
ParametersAndBuffers train_reference_with_norm() {
  NormNet net = make_norm_net(7);
  auto optimizer = make_sgd(net->parameters());
  for (int step = 0; step < kNormMostBatches; ++step) {
    optimizer.zero_grad();
    const std::vector<torch::Tensor> before = buffers_of(*net);
    std::vector<torch::Tensor> after;
    int trained = 0;
    for (int r = 0; r < kWorld; ++r) trained += step < kNormBatchesPerRank[r] ? 1 : 0;
    for (int r = 0; r < kWorld; ++r) {
      if (step >= kNormBatchesPerRank[r]) continue;
      set_buffers(*net, before);
      const Batch batch = norm_batch(r, step);
      (torch::mse_loss(net->forward(batch.x), batch.y) / trained).backward();
      after = buffers_of(*net);  // the highest rank's, once the loop is done
    }
    set_buffers(*net, after);
    optimizer.step();
  }
  return {snapshot(*net), buffers_of(*net)};
}

TEST(JoinNormWorker, RankZeroStopsFirst) {
  if (!is_worker_process()) GTEST_SKIP() << "runs only as a rank of Join";
  InitOptions init;
  init.backend = "gloo";
  init.timeout = std::chrono::seconds(30);
  init_process_group(init);
  ASSERT_EQ(world_size(), kWorld);
  ddp::DdpOptions options;
  options.check_replicas_every = 1;  // buffers included, since they are broadcast
  ddp::DistributedDataParallel<NormNet> model(make_norm_net(7 + rank()), default_group().communicator_ptr(), options);
  auto optimizer = make_sgd(model.parameters());
  ddp::Join join(model);
  for (int step = 0; step < kNormBatchesPerRank[rank()]; ++step) {
    const Batch batch = norm_batch(rank(), step);
    optimizer.zero_grad();
    torch::mse_loss(model(batch.x), batch.y).backward();
    optimizer.step();
  }
  join.finish([&] { optimizer.step(); });
  const ParametersAndBuffers expected = train_reference_with_norm();
  const Difference parameters = compare(snapshot(*model.module()), expected.parameters);
  const std::vector<torch::Tensor> buffers = buffers_of(*model.module());
  ASSERT_EQ(buffers.size(), expected.buffers.size());
  const auto names = model.module()->named_buffers().keys();
  double largest = 0;
  for (size_t i = 0; i < buffers.size(); ++i) {
    if (!buffers[i].is_floating_point()) {
      EXPECT_TRUE(torch::equal(buffers[i], expected.buffers[i]))
          << names[i] << ": " << buffers[i].item<int64_t>() << " batches tracked, expected "
          << expected.buffers[i].item<int64_t>() << " (one per step)";
      continue;
    }
    const double difference = (buffers[i] - expected.buffers[i]).abs().max().item<double>();
    largest = std::max(largest, difference / expected.buffers[i].abs().max().item<double>());
    EXPECT_LE(difference, 1e-5 * expected.buffers[i].abs().max().item<double>()) << names[i];
  }
  std::printf("[join parity] batch norm rank %d (%d batches): parameters relative %.3g, running statistics relative "
              "%.3g\n",
              rank(), kNormBatchesPerRank[rank()], parameters.max_rel, largest);
  EXPECT_LE(parameters.max_rel, 1e-5);
  destroy_process_group();
}

TEST(Join, BatchNormStatisticsFollowTheRanksStillTraining) {
  expect_join_ranks_succeeded(run_worker_ranks(kWorld, "JoinNormWorker.RankZeroStopsFirst", std::chrono::seconds(120)));
}

// --- Optimizer state under Join, over two epochs ------------------------------------------------------------
// The ranks that stop early step their optimizers with the averaged gradient in shadow_step, so their momentum
// (or Adam's moments) stays the trained ranks'. The second Join round then starts from equal replicas and equal
// optimizers and stays equal at every forward; both rounds together equal one process.

constexpr int kEpochBatchesPerRank[] = {3, 2, 1};
constexpr int kEpochMostBatches = 3;
constexpr int kEpochs = 2;

Batch epoch_batch(int rank, int epoch, int step) { return rank_batch(rank, 100 * (epoch + 1) + step); }

enum class OptimizerKind { kSgdMomentum, kAdam };

std::unique_ptr<torch::optim::Optimizer> make_optimizer(OptimizerKind kind, const std::vector<torch::Tensor>& params) {
  if (kind == OptimizerKind::kAdam) {
    return std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(0.01).weight_decay(1e-2));
  }
  return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(0.05).momentum(0.9).weight_decay(1e-2));
}

// Each parameter's optimizer state as tensors, named by the parameter, for a replica comparison.
torch::OrderedDict<std::string, torch::Tensor> optimizer_state(torch::optim::Optimizer& optimizer,
                                                               torch::nn::Module& module) {
  torch::OrderedDict<std::string, torch::Tensor> state;
  for (const auto& item : module.named_parameters()) {
    auto found = optimizer.state().find(compat::optimizer_state_key(item.value()));
    EXPECT_NE(found, optimizer.state().end()) << item.key() << " has no optimizer state";
    if (found == optimizer.state().end()) continue;
    if (auto* sgd = dynamic_cast<torch::optim::SGDParamState*>(found->second.get())) {
      state.insert(item.key() + ".momentum_buffer", sgd->momentum_buffer());
    } else if (auto* adam = dynamic_cast<torch::optim::AdamParamState*>(found->second.get())) {
      state.insert(item.key() + ".exp_avg", adam->exp_avg());
      state.insert(item.key() + ".exp_avg_sq", adam->exp_avg_sq());
      state.insert(item.key() + ".step", torch::tensor({static_cast<int64_t>(adam->step())}));
    }
  }
  return state;
}

std::vector<torch::Tensor> train_reference_epochs(const Scenario& s, OptimizerKind kind) {
  Net net = make_net(s, /*seed=*/7);
  auto optimizer = make_optimizer(kind, net->parameters());
  for (int epoch = 0; epoch < kEpochs; ++epoch) {
    for (int step = 0; step < kEpochMostBatches; ++step) {
      optimizer->zero_grad();
      torch::Tensor loss = torch::zeros({});
      int trained = 0;
      for (int r = 0; r < kWorld; ++r) {
        if (step >= kEpochBatchesPerRank[r]) continue;
        const Batch batch = epoch_batch(r, epoch, step);
        loss = loss + torch::mse_loss(net->forward(batch.x), batch.y);
        ++trained;
      }
      (loss / trained).backward();
      optimizer->step();
    }
  }
  return snapshot(*net);
}

void check_join_epochs_rank(OptimizerKind kind, const char* label) {
  InitOptions init;
  init.backend = "gloo";
  init.timeout = std::chrono::seconds(30);
  init_process_group(init);
  ASSERT_EQ(world_size(), kWorld);
  comm::Communicator& communicator = default_group().communicator();
  Scenario s;
  s.world = kWorld;
  s.options.check_replicas_every = 1;
  ddp::DistributedDataParallel<Net> model(make_net(s, /*seed=*/7 + rank()), default_group().communicator_ptr(),
                                          s.options);
  auto optimizer = make_optimizer(kind, model.parameters());
  for (int epoch = 0; epoch < kEpochs; ++epoch) {
    ddp::Join join(model);
    for (int step = 0; step < kEpochBatchesPerRank[rank()]; ++step) {
      const Batch batch = epoch_batch(rank(), epoch, step);
      optimizer->zero_grad();
      torch::mse_loss(model(batch.x), batch.y).backward();
      optimizer->step();
    }
    optimizer->zero_grad();
    int shadowed = 0;
    join.finish([&] {
      optimizer->step();
      optimizer->zero_grad();
      ++shadowed;
    });
    EXPECT_EQ(shadowed, kEpochMostBatches - kEpochBatchesPerRank[rank()]);
    const std::string when = fmt::format("after epoch {}", epoch);
    ddp::verify_replicas_hold_same_values(communicator, model.module()->named_parameters(), when);
    ddp::verify_replicas_hold_same_values(communicator, optimizer_state(*optimizer, *model.module()), when);
  }
  const Difference d = compare(snapshot(*model.module()), train_reference_epochs(s, kind));
  std::printf("[join parity] %s, %d epochs, rank %d (%d batches each): largest difference abs %.3g relative %.3g\n",
              label, kEpochs, rank(), kEpochBatchesPerRank[rank()], d.max_abs, d.max_rel);
  EXPECT_LE(d.max_rel, 1e-5);
  destroy_process_group();
}

TEST(JoinEpochsWorker, SgdWithMomentum) {
  if (!is_worker_process()) GTEST_SKIP() << "runs only as a rank of Join";
  check_join_epochs_rank(OptimizerKind::kSgdMomentum, "SGD with momentum");
}

TEST(JoinEpochsWorker, Adam) {
  if (!is_worker_process()) GTEST_SKIP() << "runs only as a rank of Join";
  check_join_epochs_rank(OptimizerKind::kAdam, "Adam");
}

TEST(Join, ShadowingRanksKeepTheirMomentumAcrossEpochs) {
  expect_join_ranks_succeeded(run_worker_ranks(kWorld, "JoinEpochsWorker.SgdWithMomentum", std::chrono::seconds(120)));
}

TEST(Join, ShadowingRanksKeepTheirAdamMomentsAcrossEpochs) {
  expect_join_ranks_succeeded(run_worker_ranks(kWorld, "JoinEpochsWorker.Adam", std::chrono::seconds(120)));
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
