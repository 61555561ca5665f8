// `tandem train --strategy fsdp --checkpoint-format sharded` as users run it, under `tandem run`: each rank writes
// its own file and rank 0 an index; a run continues it bit for bit on the same world size, as a continuation of
// the full-state checkpoint of the same step does on another world size, and under DDP (--zero is refused); a
// damaged or missing part is one line naming that file; --keep-checkpoints removes a checkpoint's files together.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "support/processes.h"
#include "support/tiny_datasets.h"
#include "support/weight_files.h"
#include "tandem/checkpoint/safetensors.h"

namespace tandem::app::fsdp_sharded_checkpoint {
namespace {

namespace fs = std::filesystem;

// `tandem run --nproc-per-node RANKS -- tandem train` on `data`: cnn-bn, batch 8 and 96 samples, so 6 steps an
// epoch on 2 ranks and 4 on 3; --steps 9 stops inside epoch 1, at its batch 3.
testing::ProcessResult train(int ranks, const std::string& data, const std::string& run_dir,
                             const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {testing::tandem_cli(), "run", "--nproc-per-node", std::to_string(ranks), "--",
                                   testing::tandem_cli(), "train", "--data", data, "--model", "cnn-bn", "--epochs", "3",
                                   "--batch-size", "8", "--threads", "1", "--seed", "5", "--lr", "0.001",
                                   "--no-tensorboard", "--no-report", "--timeout", "60", "--run-dir", run_dir};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return testing::run_process(argv, {}, std::chrono::seconds(120));
}

// The names in `dir` that start with "checkpoint-".
std::set<std::string> checkpoint_files(const std::string& dir) {
  std::set<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("checkpoint-", 0) == 0) names.insert(name);
  }
  return names;
}

// Copies the files of the checkpoint named `stem` from `from` into the run dir `to`.
void copy_checkpoint(const std::string& from, const std::string& stem, const std::string& to) {
  fs::create_directories(to);
  for (const std::string& name : checkpoint_files(from)) {
    if (name.rfind(stem + ".", 0) == 0) fs::copy_file(from + "/" + name, to + "/" + name);
  }
}

class FsdpShardedCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    data_ = testing::write_tiny_mnist("fsdp_sharded_data", 96, 16);
    root_ = testing::make_temp_dir(std::string("fsdp_sharded_") +
                                   ::testing::UnitTest::GetInstance()->current_test_info()->name());
  }
  void expect_success(const testing::ProcessResult& result) {
    ASSERT_FALSE(result.timed_out) << result.output;
    ASSERT_EQ(result.exit_code, 0) << result.output;
  }
  std::string data_, root_;
};

const std::vector<std::string> kSharded = {"--strategy", "fsdp", "--checkpoint-format", "sharded"};
constexpr const char* kStopped = "checkpoint-0001-00000003";

std::vector<std::string> with(std::vector<std::string> args, const std::vector<std::string>& more) {
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

TEST_F(FsdpShardedCheckpoint, ContinuesBitForBitOnTheSameWorldAndAsTheFullStateOnThreeRanksOrUnderDdp) {
  expect_success(train(2, data_, root_ + "/whole",
                       with(kSharded, {"--steps", "12", "--save-weights", root_ + "/whole.safetensors"})));
  expect_success(train(2, data_, root_ + "/stopped", with(kSharded, {"--steps", "9"})));
  expect_success(train(2, data_, root_ + "/stopped_full", {"--strategy", "fsdp", "--steps", "9"}));

  // Rank 0's file holds no parameter: every parameter lies in the ranks' files, in pieces.
  const std::string stopped = root_ + "/stopped/" + kStopped;
  const std::set<std::string> expected_files = {
      std::string(kStopped) + ".safetensors", std::string(kStopped) + ".index.json",
      std::string(kStopped) + ".rank-00000-of-00002.safetensors",
      std::string(kStopped) + ".rank-00001-of-00002.safetensors"};
  const std::set<std::string> files = checkpoint_files(root_ + "/stopped");
  for (const std::string& name : expected_files) EXPECT_EQ(files.count(name), 1u) << name;
  const checkpoint::TensorFile main_file = checkpoint::load_safetensors(stopped + ".safetensors");
  EXPECT_FALSE(main_file.find("model.conv1.weight").defined());
  EXPECT_TRUE(main_file.find("model.bn1.running_mean").defined());
  const checkpoint::TensorFile rank1 = checkpoint::load_safetensors(stopped + ".rank-00001-of-00002.safetensors");
  ASSERT_TRUE(rank1.find("output.bias").defined());
  EXPECT_TRUE(rank1.find("optimizer.state.output.bias.momentum_buffer").defined());
  copy_checkpoint(root_ + "/stopped", kStopped, root_ + "/three_sharded");
  copy_checkpoint(root_ + "/stopped_full", kStopped, root_ + "/three_full");
  copy_checkpoint(root_ + "/stopped", kStopped, root_ + "/ddp");
  copy_checkpoint(root_ + "/stopped", kStopped, root_ + "/zero");

  const testing::ProcessResult continued =
      train(2, data_, root_ + "/stopped", with(kSharded, {"--steps", "12", "--save-weights", root_ + "/continued.safetensors"}));
  expect_success(continued);
  EXPECT_NE(continued.output.find("resuming from"), std::string::npos) << continued.output;
  EXPECT_EQ(testing::weights_relative_l2(root_ + "/whole.safetensors", root_ + "/continued.safetensors"), 0.0)
      << "resume on the same world size must be bit-identical";

  // 3 ranks cut their shards from the 2 ranks' pieces: what they cut from the full state of the same step.
  expect_success(train(3, data_, root_ + "/three_sharded",
                       with(kSharded, {"--steps", "12", "--save-weights", root_ + "/three_sharded.safetensors"})));
  expect_success(train(3, data_, root_ + "/three_full",
                       {"--strategy", "fsdp", "--steps", "12", "--save-weights", root_ + "/three_full.safetensors"}));
  const double three =
      testing::weights_relative_l2(root_ + "/three_full.safetensors", root_ + "/three_sharded.safetensors");
  std::printf("3 ranks continuing the sharded checkpoint against the full one: relative L2 %g\n", three);
  EXPECT_EQ(three, 0.0);

  // DDP gathers the pieces whole; it follows the fsdp run as closely as DDP and fsdp train alike.
  const testing::ProcessResult ddp =
      train(2, data_, root_ + "/ddp", {"--steps", "12", "--save-weights", root_ + "/ddp.safetensors"});
  expect_success(ddp);
  EXPECT_NE(ddp.output.find("resuming from"), std::string::npos) << ddp.output;
  EXPECT_LE(testing::weights_relative_l2(root_ + "/whole.safetensors", root_ + "/ddp.safetensors"), 1e-5);

  // --zero's optimizer takes its state from the archive alone: refused in one line saying what to do.
  const testing::ProcessResult zero = train(2, data_, root_ + "/zero", {"--zero", "--steps", "12"});
  ASSERT_FALSE(zero.timed_out) << zero.output;
  EXPECT_NE(zero.exit_code, 0) << zero.output;
  EXPECT_NE(zero.output.find("is a sharded checkpoint of --strategy fsdp, which a sharded optimizer cannot take its "
                             "state from; continue it with --strategy fsdp"),
            std::string::npos)
      << zero.output;
}

// Checkpoints at steps 3 and 6 (--checkpoint-every 3), the newest 2 kept of 3 written (step 9 stops).
TEST_F(FsdpShardedCheckpoint, DamagedOrMissingPartsAreOneLineNamingTheFileAndKeepRemovesWholeCheckpoints) {
  const std::string run = root_ + "/run";
  expect_success(train(2, data_, run, with(kSharded, {"--steps", "9", "--checkpoint-every", "3",
                                                       "--keep-checkpoints", "2"})));
  // Step 3's checkpoint went with all its files; steps 6 (an epoch's end) and 9 stay whole.
  const std::set<std::string> kept = checkpoint_files(run);
  EXPECT_EQ(kept.size(), 8u) << ::testing::PrintToString(kept);
  for (const std::string& name : kept) {
    EXPECT_TRUE(name.rfind("checkpoint-0001-00000000.", 0) == 0 || name.rfind(std::string(kStopped) + ".", 0) == 0)
        << name;
  }

  // A flipped byte in rank 1's file of the newest: the run says so, sets that checkpoint aside with its parts
  // and continues from the one before.
  const std::string damaged = run + "/" + kStopped + ".rank-00001-of-00002.safetensors";
  {
    std::fstream file(damaged, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(-3, std::ios::end);
    file.put('\x7f');
  }
  const testing::ProcessResult skipped = train(2, data_, run, with(kSharded, {"--steps", "7"}));
  expect_success(skipped);
  EXPECT_NE(skipped.output.find("skipping a damaged checkpoint: " + damaged + ": entry"), std::string::npos)
      << skipped.output;
  EXPECT_NE(skipped.output.find("resuming from " + run + "/checkpoint-0001-00000000.safetensors"), std::string::npos)
      << skipped.output;
  EXPECT_TRUE(fs::exists(damaged + ".damaged"));
  EXPECT_TRUE(fs::exists(run + "/" + kStopped + ".index.json.damaged"));

  // Step 7's checkpoint without its rank 1 file, step 6's without its index: rank 0's one line names the newest's
  // missing file, no crash, and nothing is renamed.
  const std::string missing = run + "/checkpoint-0001-00000001.rank-00001-of-00002.safetensors";
  ASSERT_TRUE(fs::remove(missing));
  ASSERT_TRUE(fs::remove(run + "/checkpoint-0001-00000000.index.json"));
  const testing::ProcessResult refused = train(2, data_, run, with(kSharded, {"--steps", "8"}));
  ASSERT_FALSE(refused.timed_out) << refused.output;
  EXPECT_NE(refused.exit_code, 0) << refused.output;  // rank 0's 2, or its peer's 1 that the launcher met first
  EXPECT_NE(refused.output.find("error: every checkpoint in " + run + " is damaged (the newest: " + missing),
            std::string::npos)
      << refused.output;
  EXPECT_TRUE(fs::exists(run + "/checkpoint-0001-00000001.safetensors"));
}

}  // namespace
}  // namespace tandem::app::fsdp_sharded_checkpoint
