// Elastic restarts keep the run: under `tandem run --max-restarts`, every attempt shares TORCHELASTIC_RUN_ID,
// so `tandem train` without --run-dir continues the first attempt's run dir from its newest checkpoint, and ends
// with the weights of an uninterrupted run.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "support/processes.h"
#include "support/tiny_datasets.h"
#include "tandem/checkpoint/safetensors.h"

namespace tandem::testing {
namespace {

// `tandem run LAUNCHER_ARGS -- tandem train TRAIN_ARGS` with `cwd` as its working directory, where runs/ goes.
ProcessResult run_in(const std::string& cwd, const std::vector<std::string>& launcher_args,
                     const std::vector<std::string>& train_args, const std::map<std::string, std::string>& env = {}) {
  std::string command = "cd '" + cwd + "' && exec '" + tandem_cli() + "' run";
  for (const auto& arg : launcher_args) command += " '" + arg + "'";
  command += " -- '" + tandem_cli() + "' train";
  for (const auto& arg : train_args) command += " '" + arg + "'";
  return run_process({"sh", "-c", command}, env, std::chrono::seconds(150));
}

std::vector<std::string> run_dirs(const std::string& cwd) {
  std::vector<std::string> dirs;
  for (const auto& entry : std::filesystem::directory_iterator(cwd + "/runs")) dirs.push_back(entry.path().string());
  return dirs;
}

TEST(Restart, AttemptAfterAKillContinuesTheFirstAttemptsRunToTheUninterruptedWeights) {
  // 160 samples, batch 16 per rank on 2 ranks: 5 steps per epoch; a checkpoint every 2 steps.
  const std::string data = write_tiny_mnist("restart_data", 160, 40);
  const std::string whole_cwd = make_temp_dir("restart_whole"), killed_cwd = make_temp_dir("restart_killed");
  const auto train_args = [&](const std::string& cwd) {
    return std::vector<std::string>{"--data", data, "--epochs", "2", "--batch-size", "16", "--threads", "1",
                                    "--seed", "3", "--timeout", "60", "--checkpoint-every", "2",
                                    "--save-weights", cwd + "/final.safetensors"};
  };
  const ProcessResult whole = run_in(whole_cwd, {"--nproc-per-node", "2"}, train_args(whole_cwd));
  ASSERT_EQ(whole.exit_code, 0) << whole.output;

  // Rank 1 dies before step 8 (epoch 1, batch 2) of the first attempt; the newest checkpoint is step 6's.
  const ProcessResult killed = run_in(killed_cwd, {"--nproc-per-node", "2", "--max-restarts", "1"},
                                      train_args(killed_cwd), {{"TANDEM_KILL_AT", "step:1:8"}});
  EXPECT_FALSE(killed.timed_out) << killed.output;
  ASSERT_EQ(killed.exit_code, 0) << killed.output;
  EXPECT_NE(killed.output.find("restart 1 of 1"), std::string::npos) << killed.output;
  EXPECT_NE(killed.output.find("(epoch 1, batch 1, step 6)"), std::string::npos)
      << "the restarted attempt must continue from the newest checkpoint:\n" << killed.output;
  EXPECT_EQ(run_dirs(killed_cwd).size(), 1u) << "both attempts must share one run dir";

  const checkpoint::TensorFile expected = checkpoint::load_safetensors(whole_cwd + "/final.safetensors");
  const checkpoint::TensorFile actual = checkpoint::load_safetensors(killed_cwd + "/final.safetensors");
  ASSERT_EQ(expected.tensors.size(), actual.tensors.size());
  for (size_t i = 0; i < expected.tensors.size(); ++i) {
    EXPECT_TRUE(torch::equal(expected.tensors[i].second, actual.tensors[i].second)) << expected.tensors[i].first;
  }
}

TEST(Restart, RunIdThatCannotNameAFolderIsRefusedInOneLine) {
  const ProcessResult result = run_process({tandem_cli(), "run", "--run-id", "../elsewhere", "--", "true"});
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find("--run-id '../elsewhere'"), std::string::npos) << result.output;
}

}  // namespace
}  // namespace tandem::testing
