// What a run dir's checkpoints may hold that a continued run must not trust (issue 27): a damaged newest
// checkpoint is reported and the run continues from the newest intact one, ending as the uninterrupted run; a
// checkpoint of another training set is refused; links planted where the run writes its files are refused and
// their targets left untouched.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <vector>

#include "support/tiny_datasets.h"
#include "tandem/checkpoint/checkpoint_folder.h"
#include "tandem/data/tensor_dataset.h"
#include "tandem/train/loop.h"
#include "tandem/util/error.h"

namespace tandem::train {
namespace {

using testing::make_temp_dir;
using testing::separable_set;

constexpr int kRunEpochs = 3;
constexpr int64_t kRunBatch = 8;
constexpr int64_t kStepsPerEpoch = 6;  // 48 samples in batches of 8, one rank


torch::nn::Sequential make_net() {
  torch::manual_seed(7);
  return torch::nn::Sequential(torch::nn::Linear(8, 16), torch::nn::Tanh(), torch::nn::Dropout(0.2),
                               torch::nn::Linear(16, 2));
}

LoopOptions options_for(const std::string& run_dir) {
  LoopOptions options;
  options.epochs = kRunEpochs;
  options.batch_size = kRunBatch;
  options.run_dir = run_dir;
  options.progress = false;
  options.report = false;
  options.tensorboard = false;
  options.keep_checkpoints = 0;
  return options;
}

struct Trained {
  std::vector<torch::Tensor> weights;
  int64_t first_step = 0;  // the first step this call trained
  TrainResult result;
};

// One fit() into run_dir with a fresh model and optimizer, as a restarted program would.
Trained fit(const LoopOptions& options, std::shared_ptr<const data::Dataset> train_set = separable_set(48, 1)) {
  torch::nn::Sequential net = make_net();
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  Loop loop(options, nullptr);
  Trained trained;
  loop.callbacks().on_step = [&](const StepInfo& info) {
    if (trained.first_step == 0) trained.first_step = info.step;
  };
  trained.result = loop.fit(net, sgd, std::move(train_set), nullptr);
  for (const auto& p : net->parameters()) trained.weights.push_back(p.detach().clone());
  return trained;
}

void expect_identical(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i])) << "tensor " << i;
}

// A run stopped by max_steps inside epoch 1, with checkpoints after epoch 0 and where it stopped.
std::string run_stopped_inside_epoch_one(const std::string& name) {
  const std::string run_dir = make_temp_dir(name);
  LoopOptions stopped = options_for(run_dir);
  stopped.max_steps = kStepsPerEpoch + 3;
  fit(stopped);
  EXPECT_EQ(checkpoint::list_checkpoints(run_dir),
            (std::vector<std::string>{checkpoint::checkpoint_path(run_dir, 1, 0), checkpoint::checkpoint_path(run_dir, 1, 3)}));
  return run_dir;
}

std::string fit_error(const LoopOptions& options, std::shared_ptr<const data::Dataset> train_set) {
  try {
    fit(options, std::move(train_set));
  } catch (const std::exception& error) {
    return error.what();
  }
  return "";
}

TEST(CheckpointResume, ATruncatedNewestCheckpointIsSkippedForTheNewestIntactOne) {
  const Trained uninterrupted = fit(options_for(make_temp_dir("uninterrupted")));
  const std::string run_dir = run_stopped_inside_epoch_one("truncated_newest");
  const std::string newest = checkpoint::checkpoint_path(run_dir, 1, 3);
  std::filesystem::resize_file(newest, std::filesystem::file_size(newest) / 2);

  const Trained resumed = fit(options_for(run_dir));
  EXPECT_EQ(resumed.first_step, kStepsPerEpoch + 1) << "continued from the checkpoint after epoch 0";
  EXPECT_EQ(resumed.result.steps, kRunEpochs * kStepsPerEpoch);
  expect_identical(resumed.weights, uninterrupted.weights);
  EXPECT_TRUE(std::filesystem::exists(newest + ".damaged")) << "kept aside, where pruning cannot mistake it";
}

TEST(CheckpointResume, ANewestCheckpointWithAFlippedByteIsSkippedForTheNewestIntactOne) {
  const std::string run_dir = run_stopped_inside_epoch_one("flipped_newest");
  const std::string newest = checkpoint::checkpoint_path(run_dir, 1, 3);
  {
    std::fstream file(newest, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(-5, std::ios::end);  // the last tensor's bytes
    file.put('\x5a');
  }
  const Trained resumed = fit(options_for(run_dir));
  EXPECT_EQ(resumed.first_step, kStepsPerEpoch + 1);
}

TEST(CheckpointResume, WhenNoCheckpointIsIntactTheRunStopsWithOneLine) {
  const std::string run_dir = run_stopped_inside_epoch_one("none_intact");
  for (const std::string& checkpoint : checkpoint::list_checkpoints(run_dir)) {
    std::filesystem::resize_file(checkpoint, 100);
  }
  const std::string error = fit_error(options_for(run_dir), separable_set(48, 1));
  EXPECT_NE(error.find(run_dir), std::string::npos) << error;
  EXPECT_NE(error.find("damaged"), std::string::npos) << error;
  EXPECT_EQ(error.find('\n'), std::string::npos) << error;
  EXPECT_EQ(checkpoint::list_checkpoints(run_dir).size(), 2u) << "nothing is moved aside when nothing can be continued";
}

// batches_done counts batches of the training set the checkpoint was written with: on other data it would skip
// or repeat samples silently (issue 27, #10).
TEST(CheckpointResume, ACheckpointOfAnotherTrainingSetIsRefusedInOneLine) {
  const std::string run_dir = run_stopped_inside_epoch_one("other_data");
  for (const auto& other : {separable_set(48, 2), separable_set(56, 1)}) {
    const std::string error = fit_error(options_for(run_dir), other);
    EXPECT_NE(error.find("same training data"), std::string::npos) << error;
    EXPECT_NE(error.find("`run_dir`"), std::string::npos) << error;
    EXPECT_EQ(error.find('\n'), std::string::npos) << error;
  }
  EXPECT_EQ(fit(options_for(run_dir)).first_step, kStepsPerEpoch + 4) << "the same data continues";
}

// A link planted where the run writes its records must not redirect the writes (issue 27, #15), whether its
// target exists or not.
TEST(CheckpointResume, LinksPlantedAsTheRunsRecordsAreRefusedAndTheirTargetsUntouched) {
  for (const std::string name : {"metrics.jsonl", "steps.jsonl"}) {
    for (const bool target_exists : {true, false}) {
      SCOPED_TRACE(name + (target_exists ? ", existing target" : ", missing target"));
      const std::string run_dir = make_temp_dir("planted_" + name + (target_exists ? "_1" : "_0"));
      const std::string outside = make_temp_dir("planted_target_" + name) + "/precious.txt";
      std::filesystem::remove(outside);
      if (target_exists) std::ofstream(outside) << "{\"epoch\":0,\"step\":0}\n";
      std::filesystem::create_symlink(outside, run_dir + "/" + name);
      const std::string error = fit_error(options_for(run_dir), separable_set(48, 1));
      EXPECT_NE(error.find(run_dir + "/" + name), std::string::npos) << error;
      EXPECT_NE(error.find("symbolic link"), std::string::npos) << error;
      EXPECT_EQ(error.find('\n'), std::string::npos) << error;
      if (target_exists) {
        std::ifstream in(outside);
        EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), "{\"epoch\":0,\"step\":0}\n");
      } else {
        EXPECT_FALSE(std::filesystem::exists(outside));
      }
    }
  }
}

}  // namespace
}  // namespace tandem::train
