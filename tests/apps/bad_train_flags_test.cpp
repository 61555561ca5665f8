// `tandem train`'s flags out of their range, through the built binary (issue 29): each is one line naming the
// flag, what it accepts and what it got, with exit code 2, before any work. Before, a negative momentum or weight
// decay reached LibTorch's SGD and came back as its backtrace, --image-size 20000 as a failed allocation of
// gigabytes, --epochs 99999999999 as CLI11's "Could not convert" with no range, --lr 1e300 as "cannot be
// converted to type float without overflow" naming no flag, --seed -1 as the seed 18446744073709551615, and
// --sync-bn on the CNN, --val-split and --min-crop-scale on MNIST files trained on as if they were not given, and
// OMP_NUM_THREADS=100000 never got past starting its threads.
#include <gtest/gtest.h>
#include <torch/version.h>

#include <filesystem>
#include <string>
#include <vector>

#include "support/bad_input.h"
#include "support/tiny_datasets.h"

namespace tandem::app::bad_train_flags {
namespace {

using testing::BadInput;

// Stand-ins in a row's arguments for what is made when the row runs: the rows are listed before any test runs.
constexpr const char* kTinyMnist = "<tiny MNIST files>";
constexpr const char* kTinyImageFolder = "<tiny image folder>";
constexpr const char* kRunDir = "<run dir>";

// `tandem train ARGS` on `data` for one short epoch: the rows that get past the command line refuse before
// training, but should one train, it is over in a moment and writes only under the test's run dir.
std::vector<std::string> train_on(const char* data, const std::vector<std::string>& args) {
  std::vector<std::string> argv = {"train", "--data", data, "--epochs", "1", "--batch-size", "8", "--threads", "1",
                                   "--no-tensorboard", "--no-report", "--run-dir", kRunDir};
  argv.insert(argv.end(), args.begin(), args.end());
  return argv;
}

// As train_on, with `batch_size` samples per batch.
std::vector<std::string> train_with_batch(const char* data, const char* batch_size, const std::vector<std::string>& args) {
  std::vector<std::string> argv = train_on(data, args);
  argv[6] = batch_size;
  return argv;
}

std::vector<std::string> train(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {"train"};
  argv.insert(argv.end(), args.begin(), args.end());
  return argv;
}

std::vector<BadInput> bad_inputs() {
  std::vector<BadInput> rows = {
      // SGD's own settings, refused by LibTorch with a backtrace before.
      {"MomentumNegative", train({"--momentum", "-1"}),
       {"tandem: error: --momentum: must be at least 0 and below 1, not -1 (see --help)"}},
      {"MomentumNan", train({"--momentum", "nan"}), {"--momentum: must be at least 0 and below 1, not nan"}},
      {"MomentumOfOne", train({"--momentum", "1"}), {"--momentum: must be at least 0 and below 1, not 1"}},
      {"WeightDecayNegative", train({"--weight-decay", "-1"}),
       {"--weight-decay: must be between 0 and 3.4028235e+38, not -1"}},
      {"WeightDecayNan", train({"--weight-decay", "nan"}), {"--weight-decay:", "not nan"}},
      // The rate: not finite, or no float32.
      {"LrBeyondFloat", train({"--lr", "1e300"}), {"--lr: must be greater than 0 and at most 3.4028235e+38, not 1e300"}},
      {"LrInfinite", train({"--lr", "inf"}), {"--lr:", "not inf"}},
      {"LrfNan", train({"--lrf", "nan"}), {"--lrf: must be between 0 and 1, not nan"}},
      // Whole numbers name their range up to their type's largest value.
      {"EpochsBeyondInt", train({"--epochs", "99999999999"}),
       {"tandem: error: --epochs: must be a whole number from 1 to 2147483647, not 99999999999 (see --help)"}},
      {"EpochsFraction", train({"--epochs", "1.5"}), {"--epochs: must be a whole number from 1 to 2147483647, not 1.5"}},
      {"BatchSizeBeyondInt64", train({"--batch-size", "9223372036854775808"}),
       {"--batch-size: must be a whole number from 1 to 9223372036854775807, not 9223372036854775808"}},
      {"StepsNegative", train({"--steps", "-1"}), {"--steps: must be a whole number from 0 to 9223372036854775807"}},
      {"SeedNegative", train({"--seed", "-1"}),
       {"--seed: must be a whole number from 0 to 18446744073709551615, not -1"}},
      {"SeedBeyondUint64", train({"--seed", "18446744073709551616"}), {"--seed:", "not 18446744073709551616"}},
      {"AccumulateBatchesZero", train({"--accumulate-batches", "0"}),
       {"--accumulate-batches: must be a whole number from 1 to 9223372036854775807, not 0"}},
      {"PowersgdRankZero", train({"--powersgd-rank", "0"}), {"--powersgd-rank: must be a whole number from 1", "not 0"}},
      {"PowersgdStartOne", train({"--powersgd-start", "1"}), {"--powersgd-start: must be a whole number from 2", "not 1"}},
      {"CheckpointEveryNegative", train({"--checkpoint-every", "-5"}),
       {"--checkpoint-every: must be a whole number from 0 to 9223372036854775807, not -5"}},
      {"KeepCheckpointsBeyondInt", train({"--keep-checkpoints", "3000000000"}),
       {"--keep-checkpoints: must be a whole number from 0 to 2147483647, not 3000000000"}},
      {"CheckReplicasEveryNegative", train({"--check-replicas-every", "-1"}),
       {"--check-replicas-every: must be a whole number from 0", "not -1"}},
      // Whole numbers whose type allows far more than a run can use.
      {"ImageSizeBeyondAnyModel", train_on(kTinyImageFolder, {"--image-size", "20000"}),
       {"--image-size: must be a whole number from 1 to 1024, not 20000"}},
      {"NumClassesBeyondAnyDataSet", train({"--num-classes", "1000000000"}),
       {"--num-classes: must be a whole number from 1 to 100000, not 1000000000"}},
      {"ThreadsBeyondAnyMachine", train({"--threads", "5000"}),
       {"--threads: must be a whole number from 0 to 1024, not 5000"}},
      {"DpReplicasZero", train({"--strategy", "dp", "--dp-replicas", "0"}),
       {"--dp-replicas: must be a whole number from 1 to 1024, not 0"}},
      {"DpReplicasBeyondAnyMachine", train({"--strategy", "dp", "--dp-replicas", "100000"}),
       {"--dp-replicas:", "not 100000"}},
      // Too short for the ranks to connect: gloo gave up "after 0 s".
      {"TimeoutBelowASecond", train({"--timeout", "0.001"}), {"--timeout: must be between 1 and 31536000, not 0.001"}},
      // Text flags the library parses, refused on the command line with the flag's name.
      {"TimelineStepsBackwards", train({"--timeline-steps", "9-3"}),
       {"--timeline-steps: must be FIRST-LAST with 1 <= FIRST <= LAST (e.g. 6-25), not 9-3"}},
      {"TimelineStepsNotAWindow", train({"--timeline-steps", "six"}), {"--timeline-steps:", "not six"}},
      {"NormalizeWithoutStd", train({"--normalize", "0.5"}),
       {"--normalize: must be MEAN,STD of finite numbers with STD above 0 (e.g. 0.2860,0.3530), not 0.5"}},
      {"NormalizeZeroStd", train({"--normalize", "0.5,0"}), {"--normalize: must be MEAN,STD", "not 0.5,0"}},
      {"NormalizeNanMean", train({"--normalize", "nan,1"}), {"--normalize: must be MEAN,STD", "not nan,1"}},
      {"NormalizeInfiniteStd", train({"--normalize", "0.5,inf"}), {"--normalize: must be MEAN,STD", "not 0.5,inf"}},
      {"ModelUnknown", train({"--model", "resnet99"}), {"--model:", "resnet99", "cnn-bn"}},
      // Settings that the data or the model leave nothing to do for: refused rather than ignored.
      {"SyncBnOnAModelWithoutBatchNorm", train_on(kTinyMnist, {"--model", "cnn", "--sync-bn"}),
       {"tandem: error: --sync-bn: model 'cnn' has no BatchNorm layers", "drop --sync-bn",
        "cnn-bn, resnet18, resnet34"}},
      {"ValSplitOnMnistFiles", train_on(kTinyMnist, {"--val-split", "0.1"}),
       {"--val-split 0.1:", "holds MNIST files", "drop --val-split"}},
      {"MinCropScaleOnMnistFiles", train_on(kTinyMnist, {"--min-crop-scale", "0.5"}),
       {"--min-crop-scale 0.5:", "holds MNIST files", "drop --min-crop-scale"}},
      // --threads' range holds for the count it defaults to: a pool of 100000 threads never finished starting.
      {"OmpNumThreadsBeyondAnyMachine",
       {"train", "--data", kTinyMnist, "--epochs", "1", "--batch-size", "8", "--run-dir", kRunDir},
       {"tandem: error: OMP_NUM_THREADS=100000", "than the 1024", "pass --threads"},
       2,
       /*only_line=*/true,
       {{"OMP_NUM_THREADS", "100000"}}},
      // What --strategy fsdp cannot train with (docs/interactions.md), refused before the rendezvous.
      {"FsdpWithZero", train_on(kTinyMnist, {"--strategy", "fsdp", "--zero"}),
       {"tandem: error: --zero cannot be combined with --strategy fsdp", "drop --zero"}},
      {"FsdpWithSyncBn", train_on(kTinyMnist, {"--strategy", "fsdp", "--model", "cnn-bn", "--sync-bn"}),
       {"--sync-bn cannot be combined with --strategy fsdp"}},
      {"FsdpWithFreezeLayers", train_on(kTinyMnist, {"--strategy", "fsdp", "--freeze-layers"}),
       {"--freeze-layers cannot be combined with --strategy fsdp"}},
      {"FsdpWithCheckReplicas", train_on(kTinyMnist, {"--strategy", "fsdp", "--check-replicas-every", "1"}),
       {"--check-replicas-every compares whole replicas", "drop --check-replicas-every"}},
      {"FsdpWithCommHook", train_on(kTinyMnist, {"--strategy", "fsdp", "--comm-hook", "fp16"}),
       {"--comm-hook fp16 shapes DDP's all-reduce, and --strategy fsdp reduce-scatters"}},
      {"FsdpWithUneven", train_on(kTinyMnist, {"--strategy", "fsdp", "--uneven"}),
       {"--uneven cannot be combined with --strategy fsdp"}},
      {"FsdpWithDpReplicas", train_on(kTinyMnist, {"--strategy", "fsdp", "--dp-replicas", "2"}),
       {"--dp-replicas needs --strategy dp"}},
      {"ReshardAfterForwardWithoutFsdp", train_on(kTinyMnist, {"--reshard-after-forward", "false"}),
       {"--reshard-after-forward needs --strategy fsdp"}},
      {"ShardedCheckpointsWithoutFsdp", train_on(kTinyMnist, {"--checkpoint-format", "sharded"}),
       {"tandem: error: --checkpoint-format sharded needs --strategy fsdp", "drop --checkpoint-format"}},
      // Flags that only shape what another flag turns on, given without it: they would do nothing (issue 41).
      {"PowersgdRankWithoutPowersgd", train_on(kTinyMnist, {"--powersgd-rank", "4"}),
       {"tandem: error: --powersgd-rank is only read with --comm-hook powersgd", "drop --powersgd-rank"}},
      {"PowersgdStartWithAnotherHook", train_on(kTinyMnist, {"--comm-hook", "fp16", "--powersgd-start", "10"}),
       {"--powersgd-start is only read with --comm-hook powersgd"}},
      {"TimelineStepsWithoutTimeline", train_on(kTinyMnist, {"--timeline-steps", "2-4"}),
       {"--timeline-steps chooses the steps that --timeline records", "add --timeline FILE"}},
      {"CheckReplicasWithDataParallel", train_on(kTinyMnist, {"--strategy", "dp", "--check-replicas-every", "5"}),
       {"--check-replicas-every compares the ranks' replicas, and --strategy dp", "drop --check-replicas-every"}},
      {"StrictWithoutInit", train_on(kTinyMnist, {"--strict"}), {"--strict checks the weights that --init loads"}},
      // Hyper-parameters of another optimizer than the one trained with (issue 44).
      {"MomentumWithAdamw", train_on(kTinyMnist, {"--optimizer", "adamw", "--momentum", "0.5"}),
       {"--momentum is sgd's and rmsprop's; --optimizer adamw averages by --betas"}},
      {"BetasWithSgd", train_on(kTinyMnist, {"--betas", "0.8,0.99"}), {"--betas is adam's and adamw's", "drop --betas"}},
      {"EpsWithSgd", train_on(kTinyMnist, {"--eps", "1e-6"}), {"--eps is adam's, adamw's and rmsprop's", "drop --eps"}},
      {"OneBeta", train_on(kTinyMnist, {"--optimizer", "adam", "--betas", "0.9"}), {"--betas"}},
      {"UnknownOptimizer", train_on(kTinyMnist, {"--optimizer", "lamb"}), {"--optimizer: lamb not in"}},
      {"InitOptimizerWithoutADistributedCheckpoint", train_on(kTinyMnist, {"--init-optimizer"}),
       {"--init-optimizer continues the optimizer state of a PyTorch distributed checkpoint", "drop --init-optimizer"}},
      // CLI11 read any whole number as a bool: 2 was true.
      {"ReshardAfterForwardNotABool", train({"--strategy", "fsdp", "--reshard-after-forward", "2"}),
       {"--reshard-after-forward: must be true or false, not 2"}},
      // A folder opens for reading as a file does: it was "a file of 9223372036854775807 bytes".
      {"InitIsAFolder", train({"--init", kTinyMnist}), {"--init:", "is a folder of neither a PyTorch distributed checkpoint (.metadata) nor sharded safetensors"}},
      {"SkipBadImagesOnMnistFiles", train_on(kTinyMnist, {"--skip-bad-images"}),
       {"--skip-bad-images:", "holds MNIST files", "drop --skip-bad-images"}},
      {"NormalizeOnAnImageFolder", train_on(kTinyImageFolder, {"--image-size", "32", "--normalize", "0.5,0.25"}),
       {"--normalize 0.5,0.25:", "is an image folder", "drop --normalize"}},
      // Part of a launcher's environment trained alone as world size 1 (issue 41).
      {"WorldSizeWithoutRank", train_on(kTinyMnist, {}),
       {"tandem: error: environment variable WORLD_SIZE=2 is set without RANK", "tandem run", "unset WORLD_SIZE"},
       2, /*only_line=*/true, {{"WORLD_SIZE", "2"}}},
      {"RankWithoutWorldSize", train_on(kTinyMnist, {}),
       {"environment variable RANK=1 is set without WORLD_SIZE", "unset RANK"}, 2, /*only_line=*/true,
       {{"RANK", "1"}}},
      {"LocalRankWithoutRank", train_on(kTinyMnist, {}), {"LOCAL_RANK=1 is set without RANK"}, 2,
       /*only_line=*/true, {{"LOCAL_RANK", "1"}}},
      {"MasterPortWithoutRank", train_on(kTinyMnist, {}), {"MASTER_PORT=29500 is set without RANK"}, 2,
       /*only_line=*/true, {{"MASTER_PORT", "29500"}}},
      // A BatchNorm layer in training mode met one sample: LibTorch's "Expected more than 1 value per channel"
      // came mid-run where a layer saw 1x1 pixels, and a CNN trained on each image's own statistics elsewhere.
      {"BatchOfOneThroughBatchNorm", train_with_batch(kTinyImageFolder, "1", {"--model", "cnn-bn"}),
       {"error: --batch-size 1 gives one sample per rank to the BatchNorm layers of --model cnn-bn, which "
        "need more than one in training mode",
        "use --batch-size 2 or more", "or train a model without BatchNorm (cnn, mlp-100m)"}},
      {"BatchOfOneThroughSyncBatchNormOnOneRank",
       train_with_batch(kTinyImageFolder, "1", {"--model", "cnn-bn", "--sync-bn"}),
       {"--batch-size 1 gives one sample per rank to the BatchNorm layers of --model cnn-bn",
        "(--sync-bn shares statistics only among 2 or more ranks)"}},
      {"DataParallelReplicaOfOneThroughBatchNorm",
       train_with_batch(kTinyImageFolder, "3", {"--model", "cnn-bn", "--strategy", "dp", "--dp-replicas", "2"}),
       {"--batch-size 3 split over --strategy dp's 2 replicas gives a replica one sample for the BatchNorm layers of "
        "--model cnn-bn",
        "use --batch-size 4 or more, fewer --dp-replicas"}},
      // A choice this build cannot honour is a wrong option too (exit 2), and names the flag.
      {"BackendNotBuiltIn", train_on(kTinyMnist, {"--backend", "foo"}),
       {"error: --backend 'foo' is not available in this build of tandem (available:"}},
  };
  // 1.13's CPU autocast knows only bfloat16; 2.x trains float16 on the CPU as well.
  if (TORCH_VERSION_MAJOR < 2) {
    rows.push_back({"Float16OnTheCpuOfLibTorch113", train_on(kTinyMnist, {"--precision", "16-mixed", "--device", "cpu"}),
                    {"error: autocast to float16 on cpu", "use --precision bf16-mixed"}});
  }
  return rows;
}

// The folder a stand-in names, written once for the suite.
std::string made_for(const std::string& stand_in, const std::string& row_name) {
  static const std::string mnist = testing::write_tiny_mnist("bad_train_flags_mnist", 32, 8);
  static const std::string image_folder = testing::write_tiny_image_folder("bad_train_flags_images", 4);
  if (stand_in == kTinyMnist) return mnist;
  if (stand_in == kTinyImageFolder) return image_folder;
  if (stand_in == kRunDir) return testing::make_temp_dir("bad_train_flags_" + row_name) + "/run";
  return stand_in;
}

class BadTrainFlags : public ::testing::TestWithParam<BadInput> {};

TEST_P(BadTrainFlags, IsRefusedInOneLineBeforeAnyWork) {
  BadInput input = GetParam();
  std::string run_dir;
  for (std::string& arg : input.args) {
    const bool is_run_dir = arg == kRunDir;
    arg = made_for(arg, input.name);
    if (is_run_dir) run_dir = arg;
  }
  testing::expect_one_line_refusal(input);
  if (!run_dir.empty()) {
    EXPECT_FALSE(std::filesystem::exists(run_dir)) << "the run started: " << run_dir;
  }
}

INSTANTIATE_TEST_SUITE_P(Table, BadTrainFlags, ::testing::ValuesIn(bad_inputs()),
                         [](const ::testing::TestParamInfo<BadInput>& info) { return info.param.name; });

}  // namespace
}  // namespace tandem::app::bad_train_flags
