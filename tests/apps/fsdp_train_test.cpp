// `tandem train --strategy fsdp` as users run it, under `tandem run` on 2 ranks: it trains the DDP run's
// trajectory, its checkpoints are ordinary full-state ones (a DDP run continues them, and so does an fsdp run, on
// the same world size bit for bit and on another one), and the combinations it cannot train are refused
// (tests/apps/bad_train_flags_test.cpp, docs/interactions.md).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "support/processes.h"
#include "support/tiny_datasets.h"
#include "support/weight_files.h"
#include "tandem/checkpoint/safetensors.h"

namespace tandem::app {
namespace {

constexpr int kSteps = 30;

// `tandem run --nproc-per-node RANKS -- tandem train` on `data`: cnn-bn (BatchNorm's buffers too), batch 8 and 96
// samples, so 6 steps an epoch on 2 ranks; --steps 30 ends with epoch 4, --steps 15 inside epoch 2.
testing::ProcessResult train(int ranks, const std::string& data, const std::string& run_dir,
                             const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {testing::tandem_cli(), "run", "--nproc-per-node", std::to_string(ranks), "--",
                                   testing::tandem_cli(), "train", "--data", data, "--model", "cnn-bn", "--epochs", "6",
                                   "--batch-size", "8", "--threads", "1", "--seed", "5", "--no-tensorboard",
                                   "--no-report", "--timeout", "60", "--run-dir", run_dir};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return testing::run_process(argv, {}, std::chrono::seconds(150));
}

class FsdpTrain : public ::testing::Test {
 protected:
  void SetUp() override {
    data_ = testing::write_tiny_mnist("fsdp_train_data", 96, 16);
    // A folder per test: a run dir that holds a checkpoint would be continued.
    root_ = testing::make_temp_dir(std::string("fsdp_train_") +
                                   ::testing::UnitTest::GetInstance()->current_test_info()->name());
  }
  void expect_success(const testing::ProcessResult& result) {
    ASSERT_FALSE(result.timed_out) << result.output;
    ASSERT_EQ(result.exit_code, 0) << result.output;
  }
  std::string data_, root_;
};

TEST_F(FsdpTrain, TwoRanksEndWhereDdpEndsAfterThirtySteps) {
  const std::vector<std::string> steps = {"--steps", std::to_string(kSteps)};
  auto ddp_args = steps;
  ddp_args.insert(ddp_args.end(), {"--save-weights", root_ + "/ddp.safetensors"});
  expect_success(train(2, data_, root_ + "/ddp", ddp_args));
  for (const std::string reshard : {"true", "false"}) {
    SCOPED_TRACE("--reshard-after-forward " + reshard);
    const std::string weights = root_ + "/fsdp_" + reshard + ".safetensors";
    auto fsdp_args = steps;
    fsdp_args.insert(fsdp_args.end(), {"--strategy", "fsdp", "--reshard-after-forward", reshard, "--save-weights",
                                       weights});
    const testing::ProcessResult fsdp = train(2, data_, root_ + "/fsdp_" + reshard, fsdp_args);
    expect_success(fsdp);
    EXPECT_NE(fsdp.output.find("fsdp, " + std::string(reshard == "true" ? "reshard" : "no reshard") + " after forward"),
              std::string::npos) << fsdp.output;
    EXPECT_NE(fsdp.output.find("[epoch 4]"), std::string::npos) << fsdp.output;
    const double difference = testing::weights_relative_l2(root_ + "/ddp.safetensors", weights);
    std::printf("fsdp (reshard after forward %s) against ddp after %d steps: relative L2 %g\n", reshard.c_str(),
                kSteps, difference);
    EXPECT_LE(difference, 1e-5);
  }
}

TEST_F(FsdpTrain, AccumulatedBatchesEndWhereDdpsDo) {
  const std::vector<std::string> common = {"--steps", "10", "--accumulate-batches", "2"};
  auto ddp_args = common;
  ddp_args.insert(ddp_args.end(), {"--save-weights", root_ + "/ddp.safetensors"});
  expect_success(train(2, data_, root_ + "/ddp", ddp_args));
  auto fsdp_args = common;
  fsdp_args.insert(fsdp_args.end(), {"--strategy", "fsdp", "--save-weights", root_ + "/fsdp.safetensors"});
  expect_success(train(2, data_, root_ + "/fsdp", fsdp_args));
  EXPECT_LE(testing::weights_relative_l2(root_ + "/ddp.safetensors", root_ + "/fsdp.safetensors"), 1e-5);
}

// Stopped at step 15 (inside an epoch), continued to 30: on 2 ranks bit for bit the uninterrupted run; by a DDP
// run from the same checkpoint, as close as DDP and FSDP are; on 3 ranks, re-sharded, to the end.
TEST_F(FsdpTrain, CheckpointsContinueOnTheSameWorldBitForBitAndUnderDdpOrThreeRanks) {
  const std::vector<std::string> fsdp = {"--strategy", "fsdp"};
  auto whole_args = fsdp;
  whole_args.insert(whole_args.end(), {"--steps", "30", "--save-weights", root_ + "/whole.safetensors"});
  expect_success(train(2, data_, root_ + "/whole", whole_args));

  auto stop_args = fsdp;
  stop_args.insert(stop_args.end(), {"--steps", "15"});
  expect_success(train(2, data_, root_ + "/stopped", stop_args));
  const std::string checkpoint = root_ + "/stopped/checkpoint-0002-00000003.safetensors";
  for (const std::string copy : {"ddp", "three"}) {
    std::filesystem::create_directories(root_ + "/" + copy);
    std::filesystem::copy_file(checkpoint, root_ + "/" + copy + "/checkpoint-0002-00000003.safetensors");
  }

  auto continue_args = fsdp;
  continue_args.insert(continue_args.end(), {"--steps", "30", "--save-weights", root_ + "/continued.safetensors"});
  const testing::ProcessResult continued = train(2, data_, root_ + "/stopped", continue_args);
  expect_success(continued);
  EXPECT_NE(continued.output.find("resuming from"), std::string::npos) << continued.output;
  EXPECT_EQ(testing::weights_relative_l2(root_ + "/whole.safetensors", root_ + "/continued.safetensors"), 0.0)
      << "resume on the same world size must be bit-identical";

  const testing::ProcessResult ddp =
      train(2, data_, root_ + "/ddp", {"--steps", "30", "--save-weights", root_ + "/ddp.safetensors"});
  expect_success(ddp);
  EXPECT_NE(ddp.output.find("resuming from"), std::string::npos) << ddp.output;
  EXPECT_LE(testing::weights_relative_l2(root_ + "/whole.safetensors", root_ + "/ddp.safetensors"), 1e-5);

  auto three_args = fsdp;
  three_args.insert(three_args.end(), {"--steps", "30"});
  const testing::ProcessResult three = train(3, data_, root_ + "/three", three_args);
  expect_success(three);
  EXPECT_NE(three.output.find("continues on 3 ranks"), std::string::npos) << three.output;
  EXPECT_NE(three.output.find("[epoch 5]"), std::string::npos) << three.output;
}

}  // namespace
}  // namespace tandem::app
