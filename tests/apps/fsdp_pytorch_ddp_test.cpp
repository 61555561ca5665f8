// Issue 32's "Done when": `tandem run --nproc-per-node 2 -- tandem train --strategy fsdp`, 30 steps from initial
// weights PyTorch wrote (--init, PyTorch's names), ends within 1e-4 (relative L2 of all parameters) of PyTorch's
// own DistributedDataParallel training 30 steps from them on the same data: tests/fixtures/pytorch_ddp_train.py,
// live in the checkout's .venv, does what tandem train does by default (DistributedSampler order, normalisation,
// the seeds' SGD with the rate times the world size, the cosine per epoch).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "support/processes.h"
#include "support/tiny_datasets.h"
#include "support/venv_python.h"
#include "support/weight_files.h"
#include "tandem/checkpoint/safetensors.h"

namespace tandem::app {
namespace {

// 256 training images, 16 per rank and batch: 8 steps an epoch on 2 ranks, so 30 steps cross three epoch ends and
// train in four rates of the cosine over --epochs 4.
const std::vector<std::string> kCommonFlags = {"--steps", "30", "--epochs", "4", "--batch-size", "16", "--seed", "3",
                                                "--lr", "0.01", "--normalize", "0.2860,0.3530"};

void expect_success(const testing::ProcessResult& result) {
  ASSERT_FALSE(result.timed_out) << result.output;
  ASSERT_EQ(result.exit_code, 0) << result.output;
}

TEST(FsdpAgainstPytorchDdp, ThirtyStepsFromPytorchsInitialWeightsEndWithinOneInTenThousand) {
  const std::string data = testing::write_tiny_mnist("fsdp_pytorch_ddp_data", 256, 16);
  const std::string dir = testing::make_temp_dir("fsdp_pytorch_ddp");
  const std::string init = dir + "/init.safetensors";

  std::vector<std::string> pytorch_args = {"--data", data, "--init", init, "--write-init", "--out",
                                           dir + "/pytorch.safetensors"};
  pytorch_args.insert(pytorch_args.end(), kCommonFlags.begin(), kCommonFlags.end());
  const testing::ProcessResult pytorch =
      testing::run_venv_python("tests/fixtures/pytorch_ddp_train.py", pytorch_args, std::chrono::seconds(150));
  expect_success(pytorch);

  std::vector<std::string> argv = {testing::tandem_cli(), "run", "--nproc-per-node", "2", "--",
                                   testing::tandem_cli(), "train", "--strategy", "fsdp", "--data", data, "--model",
                                   "cnn", "--init", init, "--strict", "--threads", "1", "--no-tensorboard",
                                   "--no-report", "--timeout", "60", "--run-dir", dir + "/run", "--save-weights",
                                   dir + "/tandem.safetensors"};
  argv.insert(argv.end(), kCommonFlags.begin(), kCommonFlags.end());
  const testing::ProcessResult tandem = testing::run_process(argv, {}, std::chrono::seconds(150));
  expect_success(tandem);
  EXPECT_NE(tandem.output.find("[epoch 3]"), std::string::npos) << tandem.output;

  const checkpoint::TensorFile initial = checkpoint::load_safetensors(init);
  const checkpoint::TensorFile expected = checkpoint::load_safetensors(dir + "/pytorch.safetensors");
  const checkpoint::TensorFile actual = checkpoint::load_safetensors(dir + "/tandem.safetensors");
  // Equal because both trained, not because neither did.
  EXPECT_GT(testing::weights_relative_l2(initial, expected), 1e-3) << "PyTorch's weights hardly moved";
  const double difference = testing::weights_relative_l2(expected, actual);
  std::printf("[fsdp vs pytorch ddp] tandem train --strategy fsdp against PyTorch DDP after 30 steps on 2 ranks: "
              "relative L2 %.3g (moved %.3g from the start)\n",
              difference, testing::weights_relative_l2(initial, actual));
  EXPECT_LE(difference, 1e-4);
}

}  // namespace
}  // namespace tandem::app
