// A run stopped on N ranks x b continues on M ranks x b' (issue 31): with the same global batch it ends on the
// uninterrupted run's trajectory (the CNN, 2 x 64 stopped at step 15 of 30, continued on 1 x 128 and on 4 x 32);
// with another global batch the interrupted epoch still trains every sample once and the learning rate follows
// the global batch; ZeRO's consolidated state is cut into the new world's shares, 16-mixed's loss scale carries
// over, and what cannot continue is refused in one line. Ranks are threads (support/thread_ranks.h).
#include <gtest/gtest.h>

#include <torch/version.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <vector>

#include "support/thread_ranks.h"
#include "support/tiny_datasets.h"
#include "tandem/checkpoint/checkpoint_folder.h"
#include "tandem/checkpoint/safetensors.h"
#include "tandem/data/tensor_dataset.h"
#include "tandem/nn/model_registry.h"
#include "tandem/optim/zero_redundancy_optimizer.h"
#include "tandem/train/loop.h"
#include "tandem/util/error.h"

// A namespace of its own: the tests of a folder are compiled as one unit.
namespace tandem::train::reshaped_resume {
namespace {

using testing::make_temp_dir;

constexpr int64_t kSamples = 1280;  // 10 global batches of 128: 3 epochs are the 30 steps
constexpr double kLr = 0.02;

// Noisy images of 4 classes, each with a brighter band of rows of its own, so that the CNN learns in 30 steps and
// its weights move far more than the 1e-4 the tests allow.
std::shared_ptr<const data::Dataset> image_set() {
  torch::manual_seed(3);
  const torch::Tensor labels = torch::arange(kSamples, torch::kLong).remainder(4);
  torch::Tensor images = torch::randn({kSamples, 1, 28, 28}) * 0.5;
  for (int64_t label = 0; label < 4; ++label) {
    images.index_put_({labels == label, 0, torch::indexing::Slice(label * 7, label * 7 + 3)}, 1.5);
  }
  return std::make_shared<data::TensorDataset>(images, labels);
}

LoopOptions options_for(const std::string& run_dir, int64_t batch_size) {
  LoopOptions options;
  options.drop_last = false;  // the same in every run of a run dir; no batch is partial but the 4 x 64 run's
  options.epochs = 3;
  options.batch_size = batch_size;
  options.run_dir = run_dir;
  options.lrf = 1;  // a constant rate: the scale is all there is to see in StepInfo::lr
  options.progress = false;
  options.report = false;
  options.tensorboard = false;
  options.keep_checkpoints = 0;
  return options;
}

// What one fit() on `world` thread ranks left behind.
struct Trained {
  std::vector<torch::Tensor> weights;  // rank 0's
  std::vector<StepInfo> steps;         // rank 0's, in order
  TrainResult result;                  // rank 0's
};

enum class Optimizer { kSgd, kZero };

// Every rank builds the CNN from the same seed and trains it with SGD (momentum), plain or sharded.
Trained fit_on(int world, const LoopOptions& options, Optimizer kind = Optimizer::kSgd,
               std::shared_ptr<const data::Dataset> train_set = image_set()) {
  std::vector<nn::Model> models;
  for (int r = 0; r < world; ++r) {
    torch::manual_seed(1);
    models.push_back(nn::make_model("cnn", {4, 1, 28}));
  }
  Trained trained;
  testing::run_thread_ranks(world, [&](int rank, comm::Communicator& communicator) {
    comm::CommunicatorPtr borrowed(&communicator, [](comm::Communicator*) {});
    std::vector<torch::Tensor> parameters = models[rank].module.ptr()->parameters();
    Loop loop(options, borrowed);
    if (rank == 0) loop.callbacks().on_step = [&](const StepInfo& info) { trained.steps.push_back(info); };
    TrainResult result;
    if (kind == Optimizer::kZero) {
      optim::ZeroRedundancyOptimizer sharded(
          parameters, optim::make_optimizer<torch::optim::SGD>(torch::optim::SGDOptions(kLr).momentum(0.9)), borrowed);
      result = loop.fit(models[rank].module, sharded, train_set, nullptr);
    } else {
      torch::optim::SGD sgd(parameters, torch::optim::SGDOptions(kLr).momentum(0.9));
      result = loop.fit(models[rank].module, sgd, train_set, nullptr);
    }
    if (rank == 0) trained.result = result;
  }, std::chrono::seconds(120));
  for (const auto& p : models[0].module.ptr()->parameters()) trained.weights.push_back(p.detach().clone());
  return trained;
}

// ||a - b|| / ||b|| over all the tensors together.
double relative_l2(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  double difference = 0, norm = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    difference += (a[i] - b[i]).pow(2).sum().item<double>();
    norm += b[i].pow(2).sum().item<double>();
  }
  return std::sqrt(difference / norm);
}

// 2 x 64 stopped at step 15 (inside epoch 1, after 5 of its 10 batches) into a run dir of its own; `weights`
// gets its weights there.
std::string stopped_on_two_ranks(const std::string& name, Optimizer kind = Optimizer::kSgd,
                                 std::vector<torch::Tensor>* weights = nullptr) {
  const std::string run_dir = make_temp_dir(name);
  LoopOptions stopped = options_for(run_dir, 64);
  stopped.max_steps = 15;
  const Trained trained = fit_on(2, stopped, kind);
  EXPECT_EQ(trained.result.steps, 15);
  if (weights) *weights = trained.weights;
  return run_dir;
}

// The acceptance test: the global batch stays 128, so global batch j of the continued run holds the
// samples of the uninterrupted run's, and the rate stays 2 x kLr.
TEST(ReshapedResume, TheSameGlobalBatchOnOtherRanksEndsOnTheUninterruptedTrajectory) {
  const Trained whole = fit_on(2, options_for(make_temp_dir("reshaped_whole"), 64));
  ASSERT_EQ(whole.result.steps, 30);
  for (const auto& [world, batch] : {std::pair<int, int64_t>{1, 128}, {4, 32}}) {
    SCOPED_TRACE(std::to_string(world) + " x " + std::to_string(batch));
    std::vector<torch::Tensor> at_stop;
    const std::string run_dir = stopped_on_two_ranks("reshaped_to_" + std::to_string(world), Optimizer::kSgd, &at_stop);
    const Trained continued = fit_on(world, options_for(run_dir, batch));
    ASSERT_EQ(continued.steps.size(), 15u);
    EXPECT_EQ(continued.steps.front().step, 16);
    EXPECT_EQ(continued.steps.front().epoch, 1);
    EXPECT_EQ(continued.result.steps, 30);
    for (const StepInfo& step : continued.steps) EXPECT_DOUBLE_EQ(step.lr, 2 * kLr) << "step " << step.step;
    for (size_t i = 0; i < continued.steps.size(); ++i) {
      EXPECT_NEAR(continued.steps[i].loss, whole.steps[15 + i].loss, 1e-4 * std::abs(whole.steps[15 + i].loss))
          << "step " << continued.steps[i].step;
    }
    const double difference = relative_l2(continued.weights, whole.weights);
    const double trained_after_stop = relative_l2(at_stop, whole.weights);
    std::cout << "2 x 64 -> " << world << " x " << batch << ": final parameters differ by " << difference
              << " (relative L2) from the uninterrupted run, which moved them by " << trained_after_stop
              << " after step 15\n";
    EXPECT_LT(difference, 1e-4);
    EXPECT_GT(trained_after_stop, 1e-2) << "the last 15 steps must move the weights for the bound to mean anything";
  }
}

// Rewrites the checkpoint as an older tandem wrote it: without `keys` and checksums, in the format before them
// (which loads unverified).
void as_older_tandem_wrote_it(const std::string& path, const std::set<std::string>& keys) {
  checkpoint::TensorFile file = checkpoint::load_safetensors(path);
  for (auto it = file.metadata.begin(); it != file.metadata.end();) {
    const bool dropped = it->first.rfind("crc32c.", 0) == 0 || keys.count(it->first);
    it = dropped ? file.metadata.erase(it) : std::next(it);
  }
  file.metadata["format"] = "tandem-checkpoint-2";
  checkpoint::save_safetensors(path, file.tensors, file.metadata);
}

// A checkpoint of an older tandem records neither its position nor the first batch size: its batches on its own
// layout stand for them (5 batches x 64 x 2 ranks), so it continues on 1 x 128 as a new one does.
TEST(ReshapedResume, ACheckpointWithoutItsPositionContinuesFromItsBatchesOnItsLayout) {
  const Trained whole = fit_on(2, options_for(make_temp_dir("reshaped_old_whole"), 64));
  const std::string run_dir = stopped_on_two_ranks("reshaped_old_format");
  as_older_tandem_wrote_it(checkpoint::checkpoint_path(run_dir, 1, 5), {"sample_position", "initial_batch_size"});

  const Trained continued = fit_on(1, options_for(run_dir, 128));
  ASSERT_EQ(continued.steps.size(), 15u);
  EXPECT_DOUBLE_EQ(continued.steps.front().lr, 2 * kLr) << "the first batch size is the checkpoint's 64";
  EXPECT_LT(relative_l2(continued.weights, whole.weights), 1e-4);
}

// The first checkpoints recorded no batch size either: inside an epoch, their batches count samples only on the
// world size that wrote them (with this run's batch size), so another world size is refused in one line.
TEST(ReshapedResume, ACheckpointWithoutItsBatchSizeContinuesOnlyOnItsWorldSize) {
  const std::string run_dir = stopped_on_two_ranks("reshaped_no_batch_size");
  as_older_tandem_wrote_it(checkpoint::checkpoint_path(run_dir, 1, 5),
                           {"sample_position", "initial_batch_size", "batch_size"});
  try {
    fit_on(1, options_for(run_dir, 128));
    ADD_FAILURE() << "continued on another world size without knowing what its batches held";
  } catch (const std::exception& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("did not record its batch size, on world size 2: continue it on 2 ranks"),
              std::string::npos)
        << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
  EXPECT_EQ(fit_on(2, options_for(run_dir, 64)).steps.front().step, 16) << "its own world size continues";
}

// 2 x 64 continued on 4 x 64: the 640 samples left of epoch 1 make 3 global batches of
// 256 (the last one half full on every rank), the rate doubles, and the checkpoints go on counting batches after
// the stopped run's.
TEST(ReshapedResume, AnotherGlobalBatchTrainsTheRestOfTheEpochOnceAtTheScaledRate) {
  const std::string run_dir = stopped_on_two_ranks("reshaped_wider");
  LoopOptions wider = options_for(run_dir, 64);
  wider.checkpoint_every = 1;
  const Trained continued = fit_on(4, wider);
  // Epoch 1: 3 steps (5 were done before); epoch 2: 1280 / 256 = 5.
  ASSERT_EQ(continued.steps.size(), 8u);
  EXPECT_EQ(continued.steps[2].epoch, 1);
  EXPECT_EQ(continued.steps[3].epoch, 2);
  for (const StepInfo& step : continued.steps) EXPECT_DOUBLE_EQ(step.lr, 4 * kLr) << "global batch 256 over 64";
  ASSERT_EQ(continued.result.epochs.size(), 2u);
  EXPECT_EQ(continued.result.steps, 23);
  EXPECT_EQ(checkpoint::list_checkpoints(run_dir).back(), checkpoint::checkpoint_path(run_dir, 3, 0));
  // Inside epoch 1 the names go on from the stopped run's batch 5, so that the newest stays the last one.
  const std::vector<std::string> names = checkpoint::list_checkpoints(run_dir);
  EXPECT_NE(std::find(names.begin(), names.end(), checkpoint::checkpoint_path(run_dir, 1, 6)), names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), checkpoint::checkpoint_path(run_dir, 1, 7)), names.end());
}

// --accumulate-batches is part of the global batch: 2 ranks x 64 x 2 accumulated batches (a step of 256, the rate
// 2 x kLr) continued on 4 x 64 without accumulating keeps the step of 256, so it keeps the rate. A checkpoint of
// a tandem that did not record the accumulation scales as before, by the ranks' batches alone (4 x 64 over 64).
TEST(ReshapedResume, AccumulatedBatchesCountInTheGlobalBatchOfAContinuedRun) {
  const std::string run_dir = make_temp_dir("reshaped_accumulated");
  LoopOptions accumulated = options_for(run_dir, 64);
  accumulated.accumulate_batches = 2;
  accumulated.max_steps = 7;  // 14 of each rank's batches: epoch 1, after 4 of its 10
  const Trained stopped = fit_on(2, accumulated);
  ASSERT_EQ(stopped.result.steps, 7);
  for (const StepInfo& step : stopped.steps) EXPECT_DOUBLE_EQ(step.lr, 2 * kLr) << "a new run scales by its ranks";
  const std::string older_dir = make_temp_dir("reshaped_accumulated_older");
  std::filesystem::copy(checkpoint::checkpoint_path(run_dir, 1, 4), checkpoint::checkpoint_path(older_dir, 1, 4));

  LoopOptions wider = options_for(run_dir, 64);
  wider.max_steps = 8;
  const Trained continued = fit_on(4, wider);
  ASSERT_EQ(continued.steps.size(), 1u);
  EXPECT_DOUBLE_EQ(continued.steps.front().lr, 2 * kLr) << "global batch 256 on both layouts";

  as_older_tandem_wrote_it(checkpoint::checkpoint_path(older_dir, 1, 4),
                           {"initial_accumulate_batches", "accumulate_batches"});
  LoopOptions older = options_for(older_dir, 64);
  older.max_steps = 8;
  const Trained continued_older = fit_on(4, older);
  ASSERT_EQ(continued_older.steps.size(), 1u);
  EXPECT_DOUBLE_EQ(continued_older.steps.front().lr, 4 * kLr) << "without the record, as tandems before it scaled";
}

// A checkpoint written inside a continued epoch continues again, on a third layout: 2 x 64 -> 4 x 64 stopped
// one step later (samples [0, 896) done) -> 1 x 128, whose epoch 1 then holds the 3 batches of 128 left.
TEST(ReshapedResume, AContinuedEpochContinuesAgainOnAThirdLayout) {
  const std::string run_dir = stopped_on_two_ranks("reshaped_twice");
  LoopOptions wider = options_for(run_dir, 64);
  wider.max_steps = 16;
  ASSERT_EQ(fit_on(4, wider).result.steps, 16);
  const Trained last = fit_on(1, options_for(run_dir, 128));
  ASSERT_GE(last.steps.size(), 4u);
  EXPECT_EQ(last.steps[2].epoch, 1);
  EXPECT_EQ(last.steps[3].epoch, 2) << "epoch 1 had (1280 - 896) / 128 = 3 batches left";
}

// ZeRO saves its state consolidated: continued on 1 or 3 ranks, each rank takes its share of the new partition,
// and the trajectory is the uninterrupted one's (same global batch).
TEST(ReshapedResume, ZeroContinuesOnAnotherWorldSizeWithItsStateRecut) {
  const Trained whole = fit_on(2, options_for(make_temp_dir("reshaped_zero_whole"), 64), Optimizer::kZero);
  const std::string run_dir = stopped_on_two_ranks("reshaped_zero_to_1", Optimizer::kZero);
  const Trained on_one = fit_on(1, options_for(run_dir, 128), Optimizer::kZero);
  EXPECT_EQ(on_one.result.steps, 30);
  EXPECT_LT(relative_l2(on_one.weights, whole.weights), 1e-4);

  // 3 ranks of 64: another global batch, so only that it trains on, from the momentum it was given.
  const std::string other_dir = stopped_on_two_ranks("reshaped_zero_to_3", Optimizer::kZero);
  const Trained on_three = fit_on(3, options_for(other_dir, 64), Optimizer::kZero);
  EXPECT_EQ(on_three.steps.front().step, 16);
  for (const auto& w : on_three.weights) EXPECT_TRUE(torch::isfinite(w).all().item<bool>());
}

// 16-mixed's scaler state (growing every 3 steps here) carries over to the new layout: 2 x 64 stopped at step 8
// continues on 1 x 128 from the checkpoint's scale and growth tracker (2^18 and 2 on 2.11, so a tracker started
// anew would grow at step 11, not 9). Its scales need not follow an uninterrupted 2 x 64 run's: a rank's float16
// backward divides the scaled loss by its own batch, so 1 x 128's intermediate gradients are half of 2 x 64's and
// overflow only at twice the scale (on 2.11, stopped at step 15 at 2^19, 2 x 64 skipped step 16 and backed off to
// 2^18 where 1 x 128 stepped and grew to 2^20). So the test follows the scaler's rule from the checkpoint's state.
TEST(ReshapedResume, SixteenMixedCarriesItsLossScaleOver) {
#if TORCH_VERSION_MAJOR < 2
  GTEST_SKIP() << "1.13's CPU autocast has no float16";
#endif
  constexpr int64_t kGrowthInterval = 3;
  auto with_scaler = [](LoopOptions options) {
    options.precision = amp::Precision::kFloat16Mixed;
    options.grad_scaler.growth_interval = kGrowthInterval;
    return options;
  };
  const std::string run_dir = make_temp_dir("reshaped_fp16");
  LoopOptions stopped = with_scaler(options_for(run_dir, 64));
  stopped.max_steps = 8;
  const Trained before = fit_on(2, stopped);
  ASSERT_EQ(before.steps.size(), 8u);

  const checkpoint::TensorFile checkpoint = checkpoint::load_safetensors(checkpoint::checkpoint_path(run_dir, 0, 8));
  double scale = std::stod(checkpoint.metadata.at("grad_scaler.scale"));
  int64_t tracker = std::stoll(checkpoint.metadata.at("grad_scaler.growth_tracker"));
  EXPECT_EQ(scale, before.steps.back().loss_scale) << "the checkpoint holds the stopped run's last scale";
  EXPECT_NE(scale, amp::GradScalerOptions{}.init_scale) << "a scale left at its start would prove nothing";
  EXPECT_NE(tracker, 0) << "a tracker at 0 would not show that it carried over";

  LoopOptions continued_options = with_scaler(options_for(run_dir, 128));
  continued_options.max_steps = 12;
  const Trained continued = fit_on(1, continued_options);
  ASSERT_EQ(continued.steps.size(), 4u);
  for (const StepInfo& step : continued.steps) {
    // PyTorch's update(): back off on a skipped step, grow after growth_interval steps in a row without one.
    if (!step.optimizer_stepped) {
      scale *= 0.5;
      tracker = 0;
    } else if (++tracker == kGrowthInterval) {
      scale *= 2;
      tracker = 0;
    }
    std::cout << "step " << step.step << ": stepped " << step.optimizer_stepped << ", scale " << step.loss_scale
              << " (expected " << scale << ")\n";
    EXPECT_EQ(step.loss_scale, scale) << "step " << step.step;
  }
}

// The position counts samples of the epoch's order: another seed makes another order, and is refused.
TEST(ReshapedResume, AnotherSeedIsRefusedInOneLineNamingIt) {
  const std::string run_dir = stopped_on_two_ranks("reshaped_other_seed");
  LoopOptions other = options_for(run_dir, 128);
  other.seed = 9;
  try {
    fit_on(1, other);
    ADD_FAILURE() << "continued under another seed";
  } catch (const std::exception& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("`seed` 0"), std::string::npos) << message;
    EXPECT_NE(message.find("`run_dir`"), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
}

}  // namespace
}  // namespace tandem::train::reshaped_resume
