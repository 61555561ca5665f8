// Bad input to `tandem bench train`, `overhead`, `allreduce`, `data`, `rendezvous` and `recovery`: each ends in one
// line that names the flag, the value or the file and says what to do, with exit code 2, before any worker starts
// or any rank joins (issue 29). A --batch-size of -1 used to reach the workers as a LibTorch backtrace, --steps 0
// a JSON library exception, --world-sizes 0 a message about bytes, --json to a missing folder an error after the
// whole run.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "support/bad_input.h"
#include "support/processes.h"
#include "support/scratch_dir.h"
#include "tandem/config.h"

namespace tandem::app::bad_bench_inputs {
namespace {

using testing::BadInput;

std::vector<std::string> bench_train(std::vector<std::string> args) {
  args.insert(args.begin(), {"bench", "train"});
  return args;
}

std::vector<std::string> bench_overhead(std::vector<std::string> args) {
  args.insert(args.begin(), {"bench", "overhead"});
  return args;
}

std::vector<std::string> bench_allreduce(std::vector<std::string> args) {
  args.insert(args.begin(), {"bench", "allreduce"});
  return args;
}

// `tandem bench data` on a folder that exists (the flag checks come first, the folder is never read).
std::vector<std::string> bench_data(std::vector<std::string> args) {
  args.insert(args.begin(), {"bench", "data", "--data", TANDEM_FIXTURE_DIR});
  return args;
}

// The PyTorch side script in the source tree.
std::string pytorch_script() {
  return (std::filesystem::path(TANDEM_FIXTURE_DIR) / ".." / ".." / "bench" / "train" / "pytorch_ddp_bench.py").string();
}

std::vector<std::string> bench_rendezvous(std::vector<std::string> args) {
  args.insert(args.begin(), {"bench", "rendezvous"});
  return args;
}

std::vector<std::string> bench_recovery(std::vector<std::string> args) {
  args.insert(args.begin(), {"bench", "recovery"});
  return args;
}

std::vector<BadInput> bad_inputs() {
  const std::string too_many_threads = std::to_string(std::max(1u, std::thread::hardware_concurrency()) + 1);
  std::vector<BadInput> rows = {
      // bench train: counts and sizes
      {"TrainNegativeBatchSize", bench_train({"--batch-size", "-1"}), {"--batch-size", "from 1 to", "not -1"}},
      {"TrainZeroBatchSize", bench_train({"--batch-size", "0"}), {"--batch-size", "from 1 to", "not 0"}},
      {"TrainZeroThreads", bench_train({"--threads", "0"}), {"--threads", "from 1 to", "not 0"}},
      {"TrainNegativeThreads", bench_train({"--threads", "-1"}), {"--threads", "not -1"}},
      {"TrainMoreThreadsThanCores", bench_train({"--threads", too_many_threads}),
       {"--threads", "not " + too_many_threads}},
      {"TrainZeroSteps", bench_train({"--steps", "0"}), {"--steps", "from 1 to", "not 0"}},
      {"TrainNegativeSteps", bench_train({"--steps", "-1"}), {"--steps", "not -1"}},
      {"TrainZeroRepeats", bench_train({"--repeats", "0"}), {"--repeats", "from 1 to", "not 0"}},
      {"TrainNegativeWarmup", bench_train({"--warmup", "-1"}), {"--warmup", "from 0 to", "not -1"}},
      {"TrainZeroRounds", bench_train({"--rounds", "0"}), {"--rounds", "from 1 to", "not 0"}},
      {"TrainZeroImageSize", bench_train({"--image-size", "0"}), {"--image-size", "from 1 to 1024", "not 0"}},
      {"TrainHugeImageSize", bench_train({"--image-size", "100000"}), {"--image-size", "not 100000"}},
      {"TrainImageTooSmallForTheCnn", bench_train({"--image-size", "5"}),
       {"--model cnn at --image-size 5", "at least 10x10"}},
      {"TrainDataBeyondMemory", bench_train({"--batch-size", "2000000000", "--world-sizes", "1"}),
       {"--batch-size 2000000000", "more than half of this host's", "lower --batch-size or --image-size"}},
      {"TrainZeroBucketCap", bench_train({"--bucket-cap-mb", "0"}), {"--bucket-cap-mb", "between 0.001 and", "not 0"}},
      {"TrainHugeBucketCap", bench_train({"--bucket-cap-mb", "1e30"}), {"--bucket-cap-mb", "1048576", "not 1e30"}},
      {"TrainNanBucketCap", bench_train({"--bucket-cap-mb", "nan"}), {"--bucket-cap-mb", "not nan"}},
      {"TrainNegativeFirstBucketCap", bench_train({"--first-bucket-cap-mb", "-1"}),
       {"--first-bucket-cap-mb", "not -1"}},
      {"TrainZeroPowerSgdRank", bench_train({"--comm-hook", "powersgd", "--powersgd-rank", "0"}),
       {"--powersgd-rank", "from 1 to", "not 0"}},
      {"TrainPowerSgdStartBelowTwo", bench_train({"--comm-hook", "powersgd", "--powersgd-start", "1"}),
       {"--powersgd-start", "from 2 to", "not 1"}},
      // bench train: world sizes are processes, not bytes
      {"TrainZeroWorldSize", bench_train({"--world-sizes", "0"}),
       {"--world-sizes", "'0' is not a number of processes"}},
      {"TrainNegativeWorldSize", bench_train({"--world-sizes", "-2"}),
       {"--world-sizes", "'-2' is not a number of processes", "e.g. 1,2,4"}},
      {"TrainWorldSizeNotANumber", bench_train({"--world-sizes", "abc"}),
       {"--world-sizes", "'abc' is not a number of processes"}},
      {"TrainWorldSizeInAList", bench_train({"--world-sizes", "1,x"}), {"--world-sizes", "'x' is not a number"}},
      {"TrainWorldSizeTwice", bench_train({"--world-sizes", "2,2"}), {"--world-sizes", "world size 2 is given twice"}},
      // bench train: names, files and flags that need another
      {"TrainUnknownModel", bench_train({"--model", "nope"}), {"--model", "unknown model 'nope'", "cnn", "resnet18"}},
      {"TrainUnknownCommHook", bench_train({"--comm-hook", "nope"}), {"--comm-hook", "nope"}},
      {"TrainUnknownComparison", bench_train({"--compare", "garbage"}), {"--compare", "garbage", "pytorch"}},
      {"TrainMissingPytorchScript", bench_train({"--compare", "pytorch", "--pytorch-script", "/nonexistent/x.py"}),
       {"PyTorch side script /nonexistent/x.py not found", "--pytorch-script"}},
      {"TrainPytorchScriptWithoutCompare", bench_train({"--pytorch-script", pytorch_script()}),
       {"--pytorch-script is only read with --compare pytorch"}},
      {"TrainPowerSgdRankWithoutTheHook", bench_train({"--powersgd-rank", "4"}),
       {"--powersgd-rank is only read with --comm-hook powersgd"}},
      {"TrainJsonInAMissingFolder", bench_train({"--json", "/nonexistent-dir/x.json"}),
       {"--json /nonexistent-dir/x.json", "folder /nonexistent-dir does not exist"}},
      {"TrainJsonIsAFolder", bench_train({"--json", "/"}), {"--json /: is a folder, not a file"}},
      // bench train --end-to-end: tandem train's defaults, so the flags that shape other measurements are refused
      {"TrainEndToEndWithAModel", bench_train({"--end-to-end", "--model", "resnet18"}),
       {"--model is not read with --end-to-end", "drop --model"}},
      {"TrainShortStepsWithoutEndToEnd", bench_train({"--short-steps", "3"}),
       {"--short-steps is only read with --end-to-end"}},
      {"TrainEndToEndShortStepsNotFewer", bench_train({"--end-to-end", "--steps", "10", "--short-steps", "10"}),
       {"--short-steps 10 must be fewer than --steps 10"}},
      // bench overhead
      {"OverheadZeroSteps", bench_overhead({"--steps", "0"}), {"--steps", "from 1 to", "not 0"}},
      {"OverheadZeroRepeats", bench_overhead({"--repeats", "0"}), {"--repeats", "from 1 to", "not 0"}},
      {"OverheadNegativeWarmup", bench_overhead({"--warmup", "-1"}), {"--warmup", "from 0 to", "not -1"}},
      {"OverheadZeroRounds", bench_overhead({"--rounds", "0"}), {"--rounds", "from 1 to", "not 0"}},
      {"OverheadZeroBatchSize", bench_overhead({"--batch-size", "0"}), {"--batch-size", "from 1 to", "not 0"}},
      {"OverheadZeroWorldSize", bench_overhead({"--world-sizes", "0"}),
       {"--world-sizes", "'0' is not a number of processes"}},
      {"OverheadGpuBackend", bench_overhead({"--backends", "nccl"}), {"--backends", "'nccl' is not a CPU backend"}},
      {"OverheadBackendTwice", bench_overhead({"--backends", "gloo,gloo"}),
       {"--backends", "backend gloo is given twice"}},
      {"OverheadUnknownComparison", bench_overhead({"--compare", "tensorflow"}),
       {"--compare", "tensorflow", "pytorch"}},
      {"OverheadPytorchScriptWithoutCompare", bench_overhead({"--compare", "none", "--pytorch-script", "x.py"}),
       {"--pytorch-script is only read with --compare pytorch"}},
      {"OverheadMissingPytorchScript", bench_overhead({"--pytorch-script", "/nonexistent/x.py"}),
       {"PyTorch side script /nonexistent/x.py not found"}},
      {"OverheadJsonInAMissingFolder", bench_overhead({"--json", "/nonexistent-dir/x.json"}),
       {"--json /nonexistent-dir/x.json", "folder /nonexistent-dir does not exist"}},
      // bench allreduce
      {"AllreduceNegativeIters", bench_allreduce({"--iters", "-1"}), {"--iters", "from 0 to", "not -1"}},
      {"AllreduceNegativeWarmup", bench_allreduce({"--warmup", "-1"}), {"--warmup", "from 0 to", "not -1"}},
      {"AllreduceZeroTimeout", bench_allreduce({"--timeout", "0"}), {"--timeout", "from 1 to 31536000", "not 0"}},
      {"AllreduceSizeNotBytes", bench_allreduce({"--sizes", "4X"}),
       {"--sizes", "size '4X' is not a positive number of bytes"}},
      {"AllreduceZeroSize", bench_allreduce({"--sizes", "0"}),
       {"--sizes", "size '0' is not a positive number of bytes"}},
      {"AllreduceSizesBackwards", bench_allreduce({"--sizes", "64M..4K"}), {"--sizes", "'64M..4K' runs backwards"}},
      {"AllreduceSizeBeyondMemory", bench_allreduce({"--sizes", "4K..1048576G"}),
       {"--sizes", "1048576G is more than this host's memory"}},
      {"AllreduceSizeBeyondAnyMemory", bench_allreduce({"--sizes", "99999999999G"}),
       {"--sizes", "size '99999999999G' is more than the largest"}},
      {"AllreduceMemcpySizeNotBytes", bench_allreduce({"--memcpy-size", "-1"}),
       {"--memcpy-size", "size '-1' is not a positive number of bytes"}},
      {"AllreduceMemcpySizeBeyondMemory", bench_allreduce({"--memcpy-size", "1048576G"}),
       {"--memcpy-size", "twice (the copy's source and target) is more than this host's memory"}},
      {"AllreduceJsonInAMissingFolder", bench_allreduce({"--json", "/nonexistent-dir/x.json"}),
       {"--json /nonexistent-dir/x.json", "folder /nonexistent-dir does not exist"}},
      // bench data
      {"DataWithoutAFolder", {"bench", "data"}, {"--data is required"}},
      {"DataMissingFolder", {"bench", "data", "--data", "/nonexistent-dir"}, {"--data", "/nonexistent-dir"}},
      {"DataZeroThreads", bench_data({"--threads", "0"}), {"--threads", "from 1 to", "not 0"}},
      {"DataMoreThreadsThanCores", bench_data({"--threads", too_many_threads}),
       {"--threads", "not " + too_many_threads}},
      {"DataZeroBatchSize", bench_data({"--batch-size", "0"}), {"--batch-size", "from 1 to", "not 0"}},
      {"DataZeroImageSize", bench_data({"--image-size", "0"}), {"--image-size", "from 1 to 1024", "not 0"}},
      {"DataHugeImageSize", bench_data({"--image-size", "100000"}), {"--image-size", "not 100000"}},
      {"DataZeroEpochs", bench_data({"--epochs", "0"}), {"--epochs", "from 1 to", "not 0"}},
      {"DataNegativeWarmup", bench_data({"--warmup-epochs", "-1"}), {"--warmup-epochs", "from 0 to", "not -1"}},
      {"DataZeroRounds", bench_data({"--rounds", "0"}), {"--rounds", "from 1 to", "not 0"}},
      // tandem train refused a negative seed; bench data took it as 18446744073709551615 (issue 41).
      {"DataNegativeSeed", bench_data({"--seed", "-1"}),
       {"--seed: must be a whole number from 0 to 18446744073709551615, not -1"}},
      // CLI11 read any whole number as a bool: 2 was true.
      {"TrainReshardAfterForwardNotABool", bench_train({"--strategy", "fsdp", "--reshard-after-forward", "2"}),
       {"--reshard-after-forward: must be true or false, not 2"}},
      {"MemoryReshardAfterForwardNotABool", {"bench", "memory", "--strategy", "fsdp", "--reshard-after-forward", "2"},
       {"--reshard-after-forward: must be true or false, not 2"}},
      {"DataUnknownComparison", bench_data({"--compare", "pil"}), {"--compare", "pil", "torchvision"}},
      {"DataScriptWithoutCompare", bench_data({"--torchvision-script", "/nonexistent/x.py"}),
       {"--torchvision-script is only read with --compare torchvision"}},
      {"DataMissingScript", bench_data({"--compare", "torchvision", "--torchvision-script", "/nonexistent/x.py"}),
       {"torchvision side script /nonexistent/x.py not found", "--torchvision-script"}},
      {"DataBatchBeyondMemory", bench_data({"--batch-size", "2000000000", "--image-size", "1024"}),
       {"--batch-size 2000000000 at --image-size 1024", "lower --batch-size or --image-size"}},
      // bench rendezvous: the simulated agents and the job's timings
      {"RendezvousOneAgent", bench_rendezvous({"--agents", "1"}), {"--agents", "from 2 to", "not 1"}},
      {"RendezvousTooManyAgents", bench_rendezvous({"--agents", "64,5000"}), {"--agents", "not 5000"}},
      {"RendezvousZeroKeepAlive", bench_rendezvous({"--keep-alive-interval", "0"}),
       {"--keep-alive-interval", "between", "not 0"}},
      {"RendezvousOneAttempt", bench_rendezvous({"--keep-alive-max-attempt", "1"}),
       {"--keep-alive-max-attempt", "from 2 to", "not 1"}},
      {"RendezvousZeroLastCall", bench_rendezvous({"--last-call", "0"}), {"--last-call", "between", "not 0"}},
      {"RendezvousZeroTicks", bench_rendezvous({"--heartbeat-ticks", "0"}), {"--heartbeat-ticks", "from 1 to", "not 0"}},
      // bench recovery: the kill inside the run, the comparison it knows, ranks a kill leaves someone of
      {"RecoveryKillAfterTheRun", bench_recovery({"--steps", "50", "--kill-after", "50"}),
       {"--kill-after 50 must be below --steps 50"}},
      {"RecoveryUnknownComparison", bench_recovery({"--compare", "horovod"}), {"--compare", "horovod"}},
      {"RecoveryOneRank", bench_recovery({"--ranks", "1"}), {"--ranks", "not 1"}},
      // bench checkpoint: the model's size, the folder, the comparison
      {"CheckpointParamsNotACount", {"bench", "checkpoint", "--mlp-params", "lots"},
       {"--mlp-params: must be a count such as 250M or 1G, not lots"}},
      {"CheckpointBeyondMemory", {"bench", "checkpoint", "--mlp-params", "1000G"},
       {"--mlp-params 1000000000000 makes a checkpoint of", "lower --mlp-params"}},
      {"CheckpointMissingFolder", {"bench", "checkpoint", "--mlp-params", "1M", "--mlp-width", "256", "--dir", "/nonexistent-dir"},
       {"--dir /nonexistent-dir is not a folder"}},
      {"CheckpointUnknownComparison", {"bench", "checkpoint", "--compare", "orbax"}, {"--compare", "orbax"}},
      {"CheckpointScriptWithoutCompare", {"bench", "checkpoint", "--pytorch-script", "/nonexistent/x.py"},
       {"--pytorch-script is only read with --compare pytorch"}},
  };
  if (!TANDEM_HAVE_NCCL) {
    rows.push_back({"TrainNcclWithoutNccl", bench_train({"--backend", "nccl"}), {"--backend", "nccl"}});
    rows.push_back({"AllreduceNcclWithoutNccl", bench_allreduce({"--backend", "nccl"}), {"--backend", "nccl"}});
  }
  return rows;
}

class BadBenchInput : public ::testing::TestWithParam<BadInput> {};

TEST_P(BadBenchInput, IsRefusedInOneLine) { testing::expect_one_line_refusal(GetParam()); }

INSTANTIATE_TEST_SUITE_P(Table, BadBenchInput, ::testing::ValuesIn(bad_inputs()),
                         [](const ::testing::TestParamInfo<BadInput>& info) { return info.param.name; });

// A run that fails once its workers have written their results: the PyTorch side writes none, as a script that
// crashed would. PYTHON=/bin/true passes the driver's `import torch` probe and then does nothing. The folder of
// result files must be gone afterwards, as on every other way out.
TEST(BadBenchRun, AFailedRunLeavesNoTemporaryFolder) {
  const testing::ScratchDir temporary;
  const BadInput input{"PytorchSideWritesNoResult",
                       bench_train({"--world-sizes", "1", "--steps", "1", "--repeats", "1", "--warmup", "0",
                                    "--batch-size", "8", "--compare", "pytorch", "--pytorch-script", pytorch_script()}),
                       {"error: the PyTorch DDP script wrote no result", "see its output above"},
                       1,
                       /*only_line=*/false,
                       {{"PYTHON", "/bin/true"}, {"TMPDIR", temporary.path()}}};
  testing::expect_one_line_refusal(input);
  std::vector<std::string> left;
  for (const auto& entry : std::filesystem::directory_iterator(temporary.path())) left.push_back(entry.path());
  EXPECT_TRUE(left.empty()) << "left behind: " << ::testing::PrintToString(left);
}

// The help names the backends this build has and the one used without --backend.
TEST(BadBenchRun, BackendHelpSaysThisBuildsDefault) {
  for (const char* subcommand : {"train", "allreduce"}) {
    const testing::ProcessResult result = testing::run_process({testing::tandem_cli(), "bench", subcommand, "--help"});
    ASSERT_EQ(result.exit_code, 0) << result.output;
    const std::string expected = TANDEM_HAVE_NCCL ? "(default: nccl where" : "(default: gloo; nccl needs a build";
    EXPECT_NE(result.output.find(expected), std::string::npos) << result.output;
    EXPECT_EQ(result.output.find("default: nccl on a GPU"), std::string::npos) << result.output;
  }
}

}  // namespace
}  // namespace tandem::app::bad_bench_inputs
