// The training loop with a user's own model, optimizer and data: a run stopped inside an epoch and continued
// from its checkpoint ends bit-identical to an uninterrupted one, for SGD, Adam and AdamW on 2 ranks and with
// dropout (the RNG state) on one; the schedule scales every param group by the world size and warms up
// linearly; the user's extra state comes back on resume; another optimizer kind is refused.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include <torch/version.h>

#include "support/thread_ranks.h"
#include "support/tiny_datasets.h"
#include "tandem/data/tensor_dataset.h"
#include "tandem/ddp/named_comm_hook.h"
#include "tandem/train/loop.h"
#include "tandem/train/lr_schedule.h"

namespace tandem::train {
namespace {

using testing::make_temp_dir;
using testing::separable_set;

constexpr int kEpochs = 3;
constexpr int64_t kBatch = 8;


torch::nn::Sequential make_net(uint64_t seed, double dropout = 0) {
  torch::manual_seed(seed);
  torch::nn::Sequential net(torch::nn::Linear(8, 16), torch::nn::Tanh());
  if (dropout > 0) net->push_back(torch::nn::Dropout(dropout));
  net->push_back(torch::nn::Linear(16, 2));
  return net;
}

using OptimizerFactory = std::function<std::unique_ptr<torch::optim::Optimizer>(torch::nn::Sequential&)>;

struct OptimizerCase {
  const char* name;
  OptimizerFactory make;
};

LoopOptions quiet_options(const std::string& run_dir) {
  LoopOptions options;
  options.epochs = kEpochs;
  options.batch_size = kBatch;
  options.run_dir = run_dir;
  options.progress = false;
  return options;
}

std::vector<torch::Tensor> weights_of(torch::nn::Sequential& net) {
  std::vector<torch::Tensor> weights;
  for (const auto& p : net->parameters()) weights.push_back(p.detach().clone());
  return weights;
}

void expect_identical(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b, const char* what) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(torch::equal(a[i], b[i])) << what << ": tensor " << i << " differs by up to "
                                          << (a[i] - b[i]).abs().max().item<double>();
  }
}

// What a test changes in a run of fit_on_two_ranks, and what it watches.
struct RunTweaks {
  std::function<void(LoopOptions&)> adjust_options;
  std::vector<StepInfo>* rank0_steps = nullptr;  // every step rank 0 took, in order
};

// Trains on 2 thread ranks, every rank's model built beforehand on this thread (the threads share one random
// generator). `stop_after` > 0 stops the run there; the loop then checkpoints inside an epoch.
std::vector<std::vector<torch::Tensor>> fit_on_two_ranks(const OptimizerCase& kind, const std::string& run_dir,
                                                         uint64_t init_seed, int64_t stop_after,
                                                         std::vector<TrainResult>* results = nullptr,
                                                         const RunTweaks& tweaks = {}) {
  std::vector<torch::nn::Sequential> nets{make_net(init_seed), make_net(init_seed + 1)};
  auto train_set = separable_set(96, 7), test_set = separable_set(20, 8);
  std::vector<std::vector<torch::Tensor>> weights(2);
  std::vector<TrainResult> per_rank(2);
  testing::run_thread_ranks(2, [&](int rank, comm::Communicator& communicator) {
    auto optimizer = kind.make(nets[rank]);
    LoopOptions options = quiet_options(run_dir);
    options.max_steps = stop_after;
    if (tweaks.adjust_options) tweaks.adjust_options(options);
    Loop loop(options, comm::CommunicatorPtr(&communicator, [](comm::Communicator*) {}));
    if (rank == 0 && tweaks.rank0_steps) {
      loop.callbacks().on_step = [&](const StepInfo& info) { tweaks.rank0_steps->push_back(info); };
    }
    per_rank[rank] = loop.fit(nets[rank], *optimizer, train_set, test_set);
    weights[rank] = weights_of(nets[rank]);
  });
  if (results) *results = per_rank;
  return weights;
}

class LoopResume : public ::testing::TestWithParam<OptimizerCase> {};

TEST_P(LoopResume, RunStoppedInsideAnEpochAndContinuedEndsWithTheUninterruptedWeights) {
  const std::string name = GetParam().name;
  std::vector<TrainResult> whole_results, first_part, second_part;
  const auto whole = fit_on_two_ranks(GetParam(), make_temp_dir("loop_whole_" + name), 1, 0, &whole_results);
  expect_identical(whole[0], whole[1], "the two ranks' replicas");

  // Epoch 0 has 6 steps; step 8 stops inside epoch 1. The continued run starts from other initial weights, so
  // everything it ends with must come from the checkpoint.
  const std::string split_dir = make_temp_dir("loop_split_" + name);
  fit_on_two_ranks(GetParam(), split_dir, 1, 8, &first_part);
  EXPECT_EQ(first_part[0].steps, 8);
  const auto continued = fit_on_two_ranks(GetParam(), split_dir, 50, 0, &second_part);
  expect_identical(whole[0], continued[0], "rank 0: uninterrupted against continued");
  expect_identical(whole[1], continued[1], "rank 1: uninterrupted against continued");

  // The continued run's epochs (1 and 2; epoch 1 carries its first 2 steps' loss over) equal the whole run's.
  ASSERT_EQ(whole_results[0].epochs.size(), 3u);
  ASSERT_EQ(second_part[0].epochs.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    const EpochMetrics& a = whole_results[0].epochs[i + 1];
    const EpochMetrics& b = second_part[0].epochs[i];
    EXPECT_EQ(a.epoch, b.epoch);
    EXPECT_DOUBLE_EQ(a.loss, b.loss) << "epoch " << a.epoch;
    EXPECT_EQ(a.correct, b.correct) << "epoch " << a.epoch;
    EXPECT_EQ(a.total, 20) << "each test sample once";
    EXPECT_DOUBLE_EQ(a.lr, b.lr) << "epoch " << a.epoch;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Optimizers, LoopResume,
    ::testing::Values(
        OptimizerCase{"SGD",
                      [](torch::nn::Sequential& net) -> std::unique_ptr<torch::optim::Optimizer> {
                        return std::make_unique<torch::optim::SGD>(
                            net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9).weight_decay(0.005));
                      }},
        OptimizerCase{"Adam",
                      [](torch::nn::Sequential& net) -> std::unique_ptr<torch::optim::Optimizer> {
                        return std::make_unique<torch::optim::Adam>(net->parameters(), torch::optim::AdamOptions(1e-2));
                      }},
        OptimizerCase{"AdamW",
                      [](torch::nn::Sequential& net) -> std::unique_ptr<torch::optim::Optimizer> {
                        return std::make_unique<torch::optim::AdamW>(
                            net->parameters(), torch::optim::AdamWOptions(1e-2).weight_decay(0.05));
                      }}),
    [](const ::testing::TestParamInfo<OptimizerCase>& info) { return std::string(info.param.name); });

const OptimizerCase kSgd{"SGD", [](torch::nn::Sequential& net) -> std::unique_ptr<torch::optim::Optimizer> {
                          return std::make_unique<torch::optim::SGD>(net->parameters(), torch::optim::SGDOptions(0.05));
                        }};

// Mixed precision resumes bit-identically too; 16-mixed's scaler state (growing every 3 steps here, so that a
// continued run without it would scale differently) comes back from the checkpoint.
class LoopPrecisionResume : public ::testing::TestWithParam<amp::Precision> {};

TEST_P(LoopPrecisionResume, ContinuedRunEndsWithTheUninterruptedWeightsAndLossScales) {
  const amp::Precision precision = GetParam();
  const std::string name = amp::to_string(precision);
#if TORCH_VERSION_MAJOR < 2
  if (precision == amp::Precision::kFloat16Mixed) GTEST_SKIP() << "1.13's CPU autocast has no float16";
#endif
  std::vector<StepInfo> whole_steps, first_steps, continued_steps;
  const auto tweaks = [&](std::vector<StepInfo>* steps) {
    return RunTweaks{[&](LoopOptions& options) {
                       options.precision = precision;
                       options.grad_scaler.growth_interval = 3;
                     },
                     steps};
  };
  const auto whole = fit_on_two_ranks(kSgd, make_temp_dir("loop_whole_" + name), 1, 0, nullptr, tweaks(&whole_steps));
  const std::string split_dir = make_temp_dir("loop_split_" + name);
  fit_on_two_ranks(kSgd, split_dir, 1, 8, nullptr, tweaks(&first_steps));
  const auto continued = fit_on_two_ranks(kSgd, split_dir, 50, 0, nullptr, tweaks(&continued_steps));
  expect_identical(whole[0], continued[0], "rank 0: uninterrupted against continued");
  ASSERT_EQ(whole_steps.size(), 18u);
  ASSERT_EQ(continued_steps.size(), 10u);
  for (size_t i = 0; i < continued_steps.size(); ++i) {
    EXPECT_EQ(continued_steps[i].loss_scale, whole_steps[8 + i].loss_scale) << "step " << whole_steps[8 + i].step;
    EXPECT_EQ(continued_steps[i].loss, whole_steps[8 + i].loss) << "step " << whole_steps[8 + i].step;
  }
  double largest_scale = 0;
  for (const StepInfo& step : whole_steps) largest_scale = std::max(largest_scale, step.loss_scale);
  if (amp::uses_loss_scaling(precision)) {
    EXPECT_GT(largest_scale, 65536.0) << "the scale never grew, so the test cannot tell a restored scaler";
  } else {
    EXPECT_EQ(largest_scale, 1.0);
  }
}

INSTANTIATE_TEST_SUITE_P(Precisions, LoopPrecisionResume,
                         ::testing::Values(amp::Precision::kBf16Mixed, amp::Precision::kFloat16Mixed),
                         [](const ::testing::TestParamInfo<amp::Precision>& info) {
                           return info.param == amp::Precision::kBf16Mixed ? std::string("Bf16Mixed")
                                                                            : std::string("Float16Mixed");
                         });

// The loss sees the model's output in the lower dtype, in training and in evaluation alike: autocast is on.
TEST(Loop, Bf16MixedRunsTheForwardPassInBfloat16AndKeepsTheWeightsInFloat32) {
  torch::nn::Sequential net = make_net(1);
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.05));
  LoopOptions options = quiet_options(make_temp_dir("loop_bf16"));
  options.epochs = 1;
  options.precision = amp::Precision::kBf16Mixed;
  std::vector<torch::ScalarType> output_dtypes;
  options.loss = [&](const torch::Tensor& output, const torch::Tensor& target) {
    output_dtypes.push_back(output.scalar_type());
    return train::cross_entropy_loss(output, target);
  };
  Loop loop(options, nullptr);
  const TrainResult result = loop.fit(net, sgd, separable_set(96, 7), separable_set(20, 8));
  ASSERT_FALSE(output_dtypes.empty());
  for (auto dtype : output_dtypes) EXPECT_EQ(dtype, torch::kBFloat16);
  for (const auto& p : net->parameters()) EXPECT_EQ(p.scalar_type(), torch::kFloat32);
  EXPECT_EQ(result.epochs.at(0).total, 20);
}

// One process either way: DataParallel's two replicas on halves of each batch train what one model does on the
// whole batch, up to float32's summation order.
TEST(Loop, StrategyDpTrainsWhatOneModelTrainsOnTheWholeBatch) {
  std::vector<std::vector<torch::Tensor>> weights;
  for (Strategy strategy : {Strategy::kDdp, Strategy::kDataParallel}) {
    torch::nn::Sequential net = make_net(1);
    torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
    LoopOptions options = quiet_options(make_temp_dir(strategy == Strategy::kDdp ? "loop_one_model" : "loop_dp"));
    options.strategy = strategy;
    options.dp_devices = {torch::kCPU, torch::kCPU};
    Loop loop(options, nullptr);
    loop.fit(net, sgd, separable_set(96, 7), separable_set(20, 8));
    weights.push_back(weights_of(net));
  }
  double largest = 0;
  for (size_t i = 0; i < weights[0].size(); ++i) {
    largest = std::max(largest, ((weights[1][i] - weights[0][i]).abs().max() / weights[0][i].abs().max()).item<double>());
  }
  std::printf("[loop dp] 2 replicas against one model, 36 steps: largest relative difference %.3g\n", largest);
  EXPECT_LT(largest, 1e-5);
}

#if TORCH_VERSION_MAJOR < 2
TEST(Loop, Float16MixedOnTheCpuOfLibTorch113IsRefusedInOneLine) {
  torch::nn::Sequential net = make_net(1);
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.05));
  LoopOptions options = quiet_options(make_temp_dir("loop_fp16_113"));
  options.precision = amp::Precision::kFloat16Mixed;
  Loop loop(options, nullptr);
  try {
    loop.fit(net, sgd, separable_set(96, 7), nullptr);
    ADD_FAILURE() << "16-mixed trained on 1.13's CPU";
  } catch (const UnsupportedError& error) {
    EXPECT_NE(std::string(error.what()).find("bf16-mixed"), std::string::npos) << error.what();
  }
}
#endif

// One rank, so that the process's one random generator is this run's alone: dropout draws a mask every step,
// and only a restored generator state gives the continued run the masks of the uninterrupted one. The user's
// extra state travels in the same checkpoint.
std::vector<torch::Tensor> fit_with_dropout(const std::string& run_dir, uint64_t init_seed, int64_t stop_after,
                                            std::map<std::string, std::string>* loaded_extra = nullptr,
                                            bool draw_at_epoch_end = false) {
  torch::nn::Sequential net = make_net(init_seed, 0.5);
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  LoopOptions options = quiet_options(run_dir);
  options.max_steps = stop_after;
  Loop loop(options, nullptr);
  int64_t steps_seen = 0;
  loop.callbacks().on_step = [&](const StepInfo& info) { steps_seen = info.step; };
  loop.callbacks().save_extra = [&] {
    checkpoint::ExtraState extra;
    extra.values["steps_seen"] = std::to_string(steps_seen);
    return extra;
  };
  loop.callbacks().load_extra = [&](const checkpoint::ExtraState& extra) {
    if (loaded_extra) *loaded_extra = extra.values;
  };
  // A user's epoch-end code that draws from the generator, as a validation on a random subset would.
  if (draw_at_epoch_end) loop.callbacks().on_epoch_end = [](const EpochMetrics&) { torch::rand({3}); };
  auto train_set = separable_set(96, 7), test_set = separable_set(20, 8);
  torch::manual_seed(1234);  // the dropout masks' stream, the same for every run of this test
  loop.fit(net, sgd, train_set, test_set);
  return weights_of(net);
}

TEST(Loop, ContinuedRunDrawsTheSameRandomNumbersAndGetsItsExtraStateBack) {
  const auto whole = fit_with_dropout(make_temp_dir("loop_dropout_whole"), 1, 0);
  const std::string split_dir = make_temp_dir("loop_dropout_split");
  fit_with_dropout(split_dir, 1, 17);
  std::map<std::string, std::string> extra;
  const auto continued = fit_with_dropout(split_dir, 50, 0, &extra);
  expect_identical(whole, continued, "uninterrupted against continued, with dropout");
  EXPECT_EQ(extra["steps_seen"], "17");
}

// A stop exactly at an epoch's end: the uninterrupted run evaluates and runs on_epoch_end there too, so the
// checkpoint must hold the generators after them, not from before.
TEST(Loop, RunStoppedAtAnEpochsEndDrawsTheSameRandomNumbersWhenContinued) {
  const auto whole = fit_with_dropout(make_temp_dir("loop_epoch_end_whole"), 1, 0, nullptr, true);
  const std::string split_dir = make_temp_dir("loop_epoch_end_split");
  fit_with_dropout(split_dir, 1, 12, nullptr, true);  // 96 samples, batch 8: epoch 0 ends at step 12
  const auto continued = fit_with_dropout(split_dir, 50, 0, nullptr, true);
  expect_identical(whole, continued, "uninterrupted against continued at an epoch's end");
}

// Each rank's BatchNorm statistics move with its own last batch; evaluation and the checkpoint must be of one
// model, the same on every rank.
TEST(Loop, EveryRankEvaluatesAndEndsWithTheBuffersOfTheSavedModel) {
  auto train_set = separable_set(96, 7), test_set = separable_set(20, 8);
  std::vector<std::vector<torch::Tensor>> buffers(2);
  std::vector<torch::nn::Sequential> nets;
  for (int rank = 0; rank < 2; ++rank) {
    torch::manual_seed(1);
    nets.push_back(torch::nn::Sequential(torch::nn::Linear(8, 16), torch::nn::BatchNorm1d(16), torch::nn::Tanh(),
                                         torch::nn::Linear(16, 2)));
  }
  const std::string run_dir = make_temp_dir("loop_buffers");
  testing::run_thread_ranks(2, [&](int rank, comm::Communicator& communicator) {
    torch::optim::SGD sgd(nets[rank]->parameters(), torch::optim::SGDOptions(0.05));
    LoopOptions options = quiet_options(run_dir);
    options.epochs = 1;
    Loop(options, comm::CommunicatorPtr(&communicator, [](comm::Communicator*) {})).fit(nets[rank], sgd, train_set, test_set);
    for (const auto& buffer : nets[rank]->buffers()) buffers[rank].push_back(buffer.clone());
  });
  ASSERT_FALSE(buffers[0].empty());
  expect_identical(buffers[0], buffers[1], "the ranks' BatchNorm buffers after fit");
}

TEST(Loop, FitGivesTheOptimizerItsRateBackSoASecondFitDoesNotCompoundTheSchedule) {
  torch::nn::Sequential net = make_net(1);
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1));
  std::vector<std::vector<double>> rates(2);
  for (size_t fit = 0; fit < rates.size(); ++fit) {
    std::vector<double>& fit_rates = rates[fit];
    LoopOptions options = quiet_options(make_temp_dir("loop_fit_" + std::to_string(fit)));
    options.epochs = 2;
    Loop loop(options, nullptr);
    loop.callbacks().on_step = [&](const StepInfo& info) { fit_rates.push_back(info.lr); };
    loop.fit(net, sgd, separable_set(96, 7), nullptr);
    EXPECT_DOUBLE_EQ(sgd.param_groups()[0].options().get_lr(), 0.1);
  }
  EXPECT_EQ(rates[0], rates[1]);
}

// Uneven inputs: ranks out of batches shadow the others' steps, and the contract says every rank runs on_step
// after each optimizer step and gets the same epoch metrics.
TEST(Loop, UnevenRanksEachSeeEveryStepAndTheSameEpochMetrics) {
  auto train_set = separable_set(52, 7);  // 18, 17, 17 samples: batches of 8 give 3, 2 and 2 steps
  std::vector<torch::nn::Sequential> nets;
  for (int rank = 0; rank < 3; ++rank) nets.push_back(make_net(1));
  std::vector<std::vector<int64_t>> steps(3);
  std::vector<TrainResult> results(3);
  const std::string run_dir = make_temp_dir("loop_uneven_steps");
  testing::run_thread_ranks(3, [&](int rank, comm::Communicator& communicator) {
    torch::optim::SGD sgd(nets[rank]->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
    LoopOptions options = quiet_options(run_dir);
    options.epochs = 2;
    options.uneven_inputs = true;
    options.ddp.check_replicas_every = 1;
    Loop loop(options, comm::CommunicatorPtr(&communicator, [](comm::Communicator*) {}));
    loop.callbacks().on_step = [&](const StepInfo& info) { steps[rank].push_back(info.step); };
    results[rank] = loop.fit(nets[rank], sgd, train_set, nullptr);
  });
  EXPECT_EQ(steps[0], (std::vector<int64_t>{1, 2, 3, 4, 5, 6}));
  for (int rank = 1; rank < 3; ++rank) {
    EXPECT_EQ(steps[rank], steps[0]) << "rank " << rank;
    for (size_t e = 0; e < 2; ++e) {
      EXPECT_DOUBLE_EQ(results[rank].epochs.at(e).loss, results[0].epochs.at(e).loss) << "rank " << rank;
      EXPECT_DOUBLE_EQ(results[rank].epochs.at(e).samples_per_second, results[0].epochs.at(e).samples_per_second);
    }
    expect_identical(weights_of(nets[0]), weights_of(nets[rank]), "replicas after uneven epochs");
  }
}

TEST(Loop, FinalRateOutsideZeroToOneIsRefusedBeforeTraining) {
  for (double lrf : {-0.5, 1.5}) {
    torch::nn::Sequential net = make_net(1);
    const std::vector<torch::Tensor> before = weights_of(net);
    torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1));
    LoopOptions options = quiet_options(make_temp_dir("loop_lrf"));
    options.lrf = lrf;
    EXPECT_THROW(Loop(options, nullptr).fit(net, sgd, separable_set(96, 7), nullptr), InvalidArgument) << lrf;
    expect_identical(before, weights_of(net), "weights after a refused fit");
  }
}

// LoopOptions::ddp is DDP's own options, but its hook is the loop's to make from `comm_hook`: one setting, in
// one place.
TEST(Loop, DdpCommHookSetBesideCommHookIsRefused) {
  torch::nn::Sequential net = make_net(1);
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1));
  LoopOptions options = quiet_options(make_temp_dir("loop_ddp_hook"));
  options.ddp.comm_hook = ddp::make_comm_hook("fp16");
  try {
    Loop(options, nullptr).fit(net, sgd, separable_set(96, 7), nullptr);
    ADD_FAILURE() << "ddp.comm_hook was set beside `comm_hook`";
  } catch (const InvalidArgument& refusal) {
    EXPECT_STREQ(refusal.what(), "ddp.comm_hook is the loop's to make, one per fit(), from `comm_hook`: leave it null "
                                 "and name the hook in `comm_hook`");
  }
}

// In-job recovery needs the membership that `tandem run --recovery in-job` gives its workers' process group; a
// Loop without one (here: no process group at all) is refused before anything trains.
TEST(Loop, InJobRecoveryWithoutAMembershipIsRefusedInOneLine) {
  torch::nn::Sequential net = make_net(1);
  const std::vector<torch::Tensor> before = weights_of(net);
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1));
  LoopOptions options = quiet_options(make_temp_dir("loop_in_job"));
  options.in_job_recovery = true;
  try {
    Loop(options, nullptr).fit(net, sgd, separable_set(96, 7), nullptr);
    ADD_FAILURE() << "in_job_recovery without a membership";
  } catch (const InvalidArgument& refusal) {
    EXPECT_NE(std::string(refusal.what()).find("`in_job_recovery` needs a process group that holds the job's membership"),
              std::string::npos)
        << refusal.what();
  }
  expect_identical(before, weights_of(net), "weights after a refused fit");
}

// A partial last batch is not a whole one: throughput counts the samples trained on.
TEST(Loop, ThroughputCountsTheSamplesOfPartialBatches) {
  torch::nn::Sequential net = make_net(1);
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1));
  LoopOptions options = quiet_options(make_temp_dir("loop_throughput"));
  options.epochs = 1;
  options.drop_last = false;
  const TrainResult result = Loop(options, nullptr).fit(net, sgd, separable_set(20, 7), nullptr);
  ASSERT_EQ(result.steps, 3) << "batches of 8, 8 and 4";
  const EpochMetrics& epoch = result.epochs.at(0);
  EXPECT_NEAR(epoch.samples_per_second * epoch.train_seconds, 20.0, 1e-6);
}

TEST(Loop, ScheduleWarmsUpLinearlyThenFollowsTheCosineForEveryParamGroupTimesTheWorldSize) {
  std::vector<std::vector<double>> rates(2);  // per rank: the first group's rate of every step
  std::vector<double> second_group_rate(2);
  auto train_set = separable_set(96, 7);
  testing::run_thread_ranks(2, [&](int rank, comm::Communicator& communicator) {
    torch::nn::Sequential replica = make_net(1);
    std::vector<torch::optim::OptimizerParamGroup> replica_groups;
    replica_groups.emplace_back(replica[0]->parameters(), std::make_unique<torch::optim::SGDOptions>(0.1));
    replica_groups.emplace_back(replica[2]->parameters(), std::make_unique<torch::optim::SGDOptions>(0.01));
    torch::optim::SGD optimizer(std::move(replica_groups), torch::optim::SGDOptions(0.1));
    LoopOptions options = quiet_options(make_temp_dir("loop_warmup_" + std::to_string(rank)));
    options.epochs = 2;
    options.warmup_steps = 4;
    Loop loop(options, comm::CommunicatorPtr(&communicator, [](comm::Communicator*) {}));
    loop.callbacks().on_step = [&](const StepInfo& info) {
      rates[rank].push_back(info.lr);
      second_group_rate[rank] = optimizer.param_groups()[1].options().get_lr();
    };
    loop.fit(replica, optimizer, train_set, nullptr);
  });
  const CosineSchedule schedule(0.2, 0.1, 2, 4);
  ASSERT_EQ(rates[0].size(), 12u) << "6 steps per epoch on 2 ranks, 2 epochs";
  for (int64_t step = 0; step < 12; ++step) {
    const int epoch = step < 6 ? 0 : 1;
    const double expected = 0.2 * schedule.factor(epoch) * (step < 4 ? (step + 1) / 4.0 : 1.0);
    EXPECT_DOUBLE_EQ(rates[0][step], expected) << "step " << step;
  }
  EXPECT_DOUBLE_EQ(rates[0][0], 0.05) << "the first warmup step: 0.1 x 2 ranks / 4";
  EXPECT_DOUBLE_EQ(second_group_rate[0], 0.01 * 2 * schedule.factor(1)) << "the second group keeps its own base";
  EXPECT_EQ(rates[0], rates[1]);
}

// Trains `net` for 3 SGD steps into a fresh run dir named `name`, then continues that run with `optimizer` and the
// options `change` makes; returns the InvalidArgument message the continuation stops with ("" if it does not).
std::string continuation_error(const std::string& name, torch::nn::Sequential& net, torch::optim::Optimizer& optimizer,
                               const std::function<void(LoopOptions&)>& change) {
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.05));
  LoopOptions options = quiet_options(make_temp_dir(name));
  options.max_steps = 3;
  Loop(options, nullptr).fit(net, sgd, separable_set(96, 7), nullptr);
  options.max_steps = 0;
  change(options);
  try {
    Loop(options, nullptr).fit(net, optimizer, separable_set(96, 7), nullptr);
  } catch (const InvalidArgument& error) {
    return error.what();
  }
  return "";
}

TEST(Loop, ContinuingARunWithAnotherKindOfOptimizerStopsWithOneLineNamingBoth) {
  torch::nn::Sequential net = make_net(1);
  torch::optim::AdamW adamw(net->parameters());
  const std::string message = continuation_error("loop_other_optimizer", net, adamw, [](LoopOptions&) {});
  EXPECT_NE(message.find("torch::optim::SGD"), std::string::npos) << message;
  EXPECT_NE(message.find("torch::optim::AdamW"), std::string::npos) << message;
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
}

// hold_model's other shapes of a model: a std::shared_ptr to a module, and an AnyModule.
TEST(Loop, TrainsAModuleHeldByASharedPtrOrAnAnyModule) {
  auto linear = std::make_shared<torch::nn::LinearImpl>(8, 2);
  const torch::Tensor before = linear->weight.detach().clone();
  torch::optim::SGD sgd(linear->parameters(), torch::optim::SGDOptions(0.05));
  LoopOptions options = quiet_options(make_temp_dir("loop_shared_ptr"));
  options.epochs = 1;
  const TrainResult result = Loop(options, nullptr).fit(linear, sgd, separable_set(96, 7), separable_set(20, 8));
  EXPECT_EQ(result.steps, 12);
  EXPECT_FALSE(torch::equal(before, linear->weight));
  EXPECT_EQ(result.epochs.at(0).total, 20);

  torch::nn::AnyModule any(torch::nn::Linear(8, 2));
  torch::optim::SGD any_sgd(any.ptr()->parameters(), torch::optim::SGDOptions(0.05));
  options.run_dir = make_temp_dir("loop_any_module");
  EXPECT_EQ(Loop(options, nullptr).fit(any, any_sgd, separable_set(96, 7), nullptr).steps, 12);
}

// The checkpoint records where its epoch stands in the order, so another batch size goes on from there
// (tests/train/reshaped_resume_test.cpp follows such runs); another order is refused.
TEST(Loop, ContinuingWithAnotherBatchSizeGoesOnButAnotherShuffleIsRefused) {
  torch::nn::Sequential net = make_net(1);
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.05));
  EXPECT_EQ(continuation_error("loop_other_batch", net, sgd,
                               [](LoopOptions& options) { options.batch_size = kBatch * 2; }),
            "");
  const std::string message = continuation_error("loop_other_shuffle", net, sgd,
                                                 [](LoopOptions& options) { options.shuffle = false; });
  EXPECT_NE(message.find("`seed` 0, `epochs` 3; resume with the same values (now 0, 3, unshuffled)"),
            std::string::npos)
      << message;
}

// Under a launcher, a Loop whose program forgot init_process_group() would train alone on every rank, all into
// one run dir.
TEST(Loop, SeveralProcessesWithoutAProcessGroupAreRefused) {
  ASSERT_EQ(::setenv("WORLD_SIZE", "2", 1), 0);
  torch::nn::Sequential net = make_net(1);
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.05));
  LoopOptions options = quiet_options(make_temp_dir("loop_no_group"));
  EXPECT_THROW(Loop(options).fit(net, sgd, separable_set(96, 7), nullptr), InvalidArgument);
  ::unsetenv("WORLD_SIZE");
}

}  // namespace
}  // namespace tandem::train
