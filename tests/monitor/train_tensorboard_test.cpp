// `tandem train`'s TensorBoard scalars as TensorBoard reads them (issue 15's contract): the per-epoch tags at
// metrics.jsonl's "step" and the per-step tags at steps.jsonl's "step", value for value after rounding to
// float32. A run whose rank is killed and restarted by `tandem run` shows each step once: the resumed run's
// SessionLog START purges the killed run's steps after its checkpoint.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "support/processes.h"
#include "support/scratch_dir.h"
#include "support/tensorboard_scalars.h"
#include "support/tiny_datasets.h"

namespace tandem::testing {
namespace {

// Runs `tandem run --nproc-per-node 2 LAUNCHER_ARGS -- tandem train` on 160 tiny MNIST samples (batch 16 per
// rank: 5 steps per epoch) with a test split, so every per-epoch tag is written.
void train_two_ranks(const std::string& run_dir, int epochs, const std::vector<std::string>& launcher_args,
                     const std::vector<std::string>& train_args, const std::map<std::string, std::string>& env) {
  std::vector<std::string> argv = {tandem_cli(), "run", "--nproc-per-node", "2"};
  argv.insert(argv.end(), launcher_args.begin(), launcher_args.end());
  const std::vector<std::string> train = {
      "--", tandem_cli(), "train", "--data", write_tiny_mnist("tensorboard_data", 160, 45),
      "--epochs", std::to_string(epochs), "--batch-size", "16", "--threads", "1", "--lr", "0.05", "--seed", "3",
      "--timeout", "60", "--run-dir", run_dir};
  argv.insert(argv.end(), train.begin(), train.end());
  argv.insert(argv.end(), train_args.begin(), train_args.end());
  const ProcessResult result = run_process(argv, env, std::chrono::seconds(180));
  ASSERT_FALSE(result.timed_out) << result.output;
  ASSERT_EQ(result.exit_code, 0) << result.output;
}

// TensorBoard's view of RUN_DIR equals its metrics.jsonl and steps.jsonl.
void expect_tensorboard_matches_jsonl(const std::string& run_dir, int epochs) {
  const std::vector<nlohmann::json> metrics = read_json_lines(run_dir + "/metrics.jsonl");
  const std::vector<nlohmann::json> steps = read_json_lines(run_dir + "/steps.jsonl");
  ASSERT_EQ(metrics.size(), static_cast<size_t>(epochs));
  ASSERT_EQ(steps.size(), static_cast<size_t>(epochs * 5));
  expect_tensorboard_matches_records(run_dir);
}

TEST(TrainTensorBoard, ScalarsEqualTheMetricsAndStepsFiles) {
  ScratchDir scratch;
  const std::string run_dir = scratch / "run";
  ASSERT_NO_FATAL_FAILURE(train_two_ranks(run_dir, 2, {}, {}, {}));
  expect_tensorboard_matches_jsonl(run_dir, 2);
}

TEST(TrainTensorBoard, RunRestartedAfterAKillShowsEachStepOnce) {
  // Rank 1 dies before step 14; `tandem run` restarts both ranks, which continue from step 12's checkpoint.
  // The killed run's rank 0 may have logged step 13, and the resumed run logs it again.
  ScratchDir scratch;
  const std::string run_dir = scratch / "run";
  ASSERT_NO_FATAL_FAILURE(train_two_ranks(run_dir, 3, {"--max-restarts", "1"}, {"--checkpoint-every", "2"},
                                          {{"TANDEM_KILL_AT", "step:1:14"}}));
  expect_tensorboard_matches_jsonl(run_dir, 3);
}

TEST(TrainTensorBoard, AResumeAfterAStepsStopInsideAnEpochShowsThatEpochOnce) {
  // --steps 7 stops inside epoch 1 (5 steps an epoch) and writes that epoch's line early, at step 7; the
  // continued run drops the line from metrics.jsonl, and TensorBoard must drop its scalars alike (issue 27, #11).
  ScratchDir scratch;
  const std::string run_dir = scratch / "run";
  ASSERT_NO_FATAL_FAILURE(train_two_ranks(run_dir, 2, {}, {"--steps", "7"}, {}));
  ASSERT_NO_FATAL_FAILURE(train_two_ranks(run_dir, 2, {}, {}, {}));
  expect_tensorboard_matches_jsonl(run_dir, 2);
}

TEST(TrainTensorBoard, ARunDirReusedWithoutACheckpointShowsOnlyTheNewRun) {
  // The first run's checkpoints are gone, so the second, shorter run starts afresh in the same directory: its
  // jsonl files drop the first run's lines, and TensorBoard must drop the first run's events alike (its second
  // epoch and steps 6-10 would otherwise show beside the new run's).
  ScratchDir scratch;
  const std::string run_dir = scratch / "run";
  ASSERT_NO_FATAL_FAILURE(train_two_ranks(run_dir, 2, {}, {}, {}));
  for (const auto& entry : std::filesystem::directory_iterator(run_dir)) {
    if (entry.path().extension() == ".safetensors") std::filesystem::remove(entry.path());
  }
  ASSERT_NO_FATAL_FAILURE(train_two_ranks(run_dir, 1, {}, {}, {}));
  expect_tensorboard_matches_jsonl(run_dir, 1);
}

}  // namespace
}  // namespace tandem::testing
