// `tandem train` end to end as users run it: real processes (2 ranks, RANK and MASTER_* set as a launcher would,
// or under `tandem run`) on tiny data sets written by the test, with deadlines. A run resumed from its checkpoint,
// also after a rank was killed mid-epoch or while writing, ends with the same weights as an uninterrupted run; a
// non-finite loss on one rank stops every rank with one message; what the program refuses is one line.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>

#include <torch/version.h>

#include "support/gpu.h"
#include "support/tiny_datasets.h"
#include "support/processes.h"
#include "support/scratch_dir.h"
#include "tandem/checkpoint/checkpoint.h"
#include "tandem/checkpoint/checkpoint_folder.h"
#include "tandem/checkpoint/safetensors.h"
#include "tandem/data/image.h"
#include "tandem/data/image_folder.h"
#include "tandem/train/run_directory.h"

namespace tandem::train {
namespace {

using testing::make_temp_dir;
using testing::read_lines;
using testing::write_tiny_image_folder;
using testing::write_tiny_mnist;

// Runs `tandem train ARGS_OF(rank)` as ranks 0..world-1 (RANK/WORLD_SIZE/MASTER_* set by hand, as a launcher
// would).
std::vector<testing::ProcessResult> run_train_ranks_with(int world,
                                                         const std::function<std::vector<std::string>(int)>& args_of,
                                                         std::map<std::string, std::string> extra_env = {}) {
  const std::string port = std::to_string(testing::free_port());
  std::vector<std::future<testing::ProcessResult>> running;
  for (int r = 0; r < world; ++r) {
    std::vector<std::string> argv = {testing::tandem_cli(), "train"};
    const std::vector<std::string> args = args_of(r);
    argv.insert(argv.end(), args.begin(), args.end());
    std::map<std::string, std::string> env = extra_env;
    env["RANK"] = std::to_string(r);
    env["LOCAL_RANK"] = std::to_string(r);
    env["WORLD_SIZE"] = std::to_string(world);
    env["LOCAL_WORLD_SIZE"] = std::to_string(world);
    env["MASTER_ADDR"] = "127.0.0.1";
    env["MASTER_PORT"] = port;
    running.push_back(std::async(std::launch::async, [argv, env] {
      return testing::run_process(argv, env, std::chrono::seconds(90));
    }));
  }
  std::vector<testing::ProcessResult> results;
  for (auto& f : running) results.push_back(f.get());
  return results;
}

std::vector<testing::ProcessResult> run_train_ranks(int world, const std::vector<std::string>& args,
                                                    std::map<std::string, std::string> extra_env = {}) {
  return run_train_ranks_with(world, [&](int) { return args; }, std::move(extra_env));
}

void expect_success(const std::vector<testing::ProcessResult>& results, const std::string& what) {
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_FALSE(results[r].timed_out) << what << ": rank " << r << " hung:\n" << results[r].output;
    EXPECT_EQ(results[r].exit_code, 0) << what << ": rank " << r << " output:\n" << results[r].output;
  }
}

TEST(TrainProcesses, ResNetWithSyncBatchNormTrainsOnAnImageFolderUnderTandemRun) {
  const std::string data = write_tiny_image_folder("image_folder", 10);
  const std::string run_dir = make_temp_dir("image_folder_run");
  const testing::ProcessResult result = testing::run_process(
      {testing::tandem_cli(), "run", "--nproc-per-node", "2", "--", testing::tandem_cli(), "train", "--model",
       "resnet18", "--data", data, "--image-size", "32", "--epochs", "1", "--sync-bn", "--batch-size", "4",
       "--threads", "1", "--run-dir", run_dir, "--timeout", "60"},
      {}, std::chrono::seconds(120));
  ASSERT_FALSE(result.timed_out) << result.output;
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("resnet18, 3 classes, SyncBatchNorm"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("[epoch 0]"), std::string::npos) << result.output;
  EXPECT_EQ(data::read_class_list(run_dir + "/class_indices.json"),
            (std::vector<std::string>{"circle", "square", "triangle"}));
  // One epoch evaluated on the 2 held-out images per class (floor(10 * 0.2)), each counted once.
  std::ifstream metrics(run_dir + "/metrics.jsonl");
  std::string line;
  ASSERT_TRUE(std::getline(metrics, line)) << "no metrics line";
  EXPECT_NE(line.find("\"total\":6"), std::string::npos) << line;
}

TEST(TrainProcesses, DataFolderThatIsNeitherKindFailsWithOneLineSayingWhatWasExpected) {
  const std::string empty = make_temp_dir("neither");
  std::ofstream(empty + "/readme.txt") << "not a data set";
  const testing::ProcessResult result =
      testing::run_process({testing::tandem_cli(), "train", "--data", empty, "--epochs", "1", "--threads", "1",
                            "--run-dir", make_temp_dir("neither_run")});
  ASSERT_FALSE(result.timed_out) << result.output;
  EXPECT_NE(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("holds neither; expected MNIST files"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("one sub-folder of .jpg/.png images per class"), std::string::npos) << result.output;

  // --image-size means nothing for MNIST files: an error that says what to do, not a silent ignore.
  const std::string mnist = write_tiny_mnist("image_size_mnist", 20, 10);
  const testing::ProcessResult sized =
      testing::run_process({testing::tandem_cli(), "train", "--data", mnist, "--image-size", "32", "--epochs", "1",
                            "--threads", "1", "--run-dir", make_temp_dir("image_size_run")});
  EXPECT_NE(sized.exit_code, 0) << sized.output;
  EXPECT_NE(sized.output.find("--image-size 32:"), std::string::npos) << sized.output;
}

void expect_same_weights(const std::string& expected_path, const std::string& actual_path) {
  checkpoint::TensorFile expected = checkpoint::load_safetensors(expected_path);
  checkpoint::TensorFile actual = checkpoint::load_safetensors(actual_path);
  ASSERT_EQ(expected.tensors.size(), actual.tensors.size());
  for (size_t i = 0; i < expected.tensors.size(); ++i) {
    ASSERT_EQ(expected.tensors[i].first, actual.tensors[i].first);
    EXPECT_TRUE(torch::equal(expected.tensors[i].second, actual.tensors[i].second)) << expected.tensors[i].first;
  }
}

TEST(TrainProcesses, ResumedRunEndsWithTheSameWeightsAsAnUninterruptedOne) {
  // 160 training samples, batch 16 per rank on 2 ranks: 5 steps per epoch.
  const std::string data = write_tiny_mnist("resume_data", 160, 45);
  const std::string root = make_temp_dir("resume_runs");
  const std::vector<std::string> common = {"--data", data, "--epochs", "2", "--batch-size", "16", "--threads", "1",
                                           "--lr", "0.05", "--seed", "3", "--timeout", "60"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = common;
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  };
  expect_success(run_train_ranks(2, with({"--run-dir", root + "/whole", "--save-weights", root + "/whole.safetensors"})),
                 "uninterrupted run");
  // Stop after the first epoch's 5 steps, then resume in a new pair of processes.
  expect_success(run_train_ranks(2, with({"--run-dir", root + "/split", "--steps", "5"})), "first half");
  auto resumed = run_train_ranks(2, with({"--run-dir", root + "/split", "--resume", "--save-weights",
                                          root + "/split.safetensors"}));
  expect_success(resumed, "resumed run");
  EXPECT_NE(resumed[0].output.find("resuming from"), std::string::npos) << resumed[0].output;
  EXPECT_NE(resumed[0].output.find("[epoch 1]"), std::string::npos) << resumed[0].output;
  EXPECT_EQ(resumed[0].output.find("[epoch 0]"), std::string::npos) << "epoch 0 must not run again";

  expect_same_weights(root + "/whole.safetensors", root + "/split.safetensors");
  // The split run's metrics hold one line per epoch, like the uninterrupted one.
  EXPECT_EQ(read_lines(root + "/split/metrics.jsonl").size(), 2u);
}

// --zero shards the SGD state, which changes no arithmetic: the weights are the plain run's, and its checkpoints
// (consolidated on rank 0, in the plain format) continue a run with --zero or without it.
TEST(TrainProcesses, ZeroTrainsLikePlainSgdAndItsCheckpointsResumeWithOrWithoutIt) {
  // 160 training samples, batch 16 per rank on 2 ranks: 5 steps per epoch.
  const std::string data = write_tiny_mnist("zero_data", 160, 45);
  const std::string root = make_temp_dir("zero_runs");
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = {"--data", data, "--epochs", "2", "--batch-size", "16", "--threads", "1",
                                     "--lr", "0.05", "--seed", "3", "--timeout", "60"};
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  };
  expect_success(run_train_ranks(2, with({"--run-dir", root + "/plain", "--save-weights", root + "/plain.safetensors"})),
                 "plain run");
  const auto zero = run_train_ranks(2, with({"--zero", "--run-dir", root + "/zero", "--save-weights",
                                             root + "/zero.safetensors"}));
  expect_success(zero, "--zero run");
  EXPECT_NE(zero[0].output.find("zero:          SGD state sharded over 2 ranks"), std::string::npos) << zero[0].output;
  expect_same_weights(root + "/plain.safetensors", root + "/zero.safetensors");

  // Stopped after the first epoch under --zero, continued once with --zero and once without.
  expect_success(run_train_ranks(2, with({"--zero", "--run-dir", root + "/split", "--steps", "5"})), "first half");
  std::filesystem::copy(root + "/split", root + "/split_plain", std::filesystem::copy_options::recursive);
  for (const auto& [dir, flags] : {std::pair<std::string, std::vector<std::string>>{"split", {"--zero"}},
                                   std::pair<std::string, std::vector<std::string>>{"split_plain", {}}}) {
    std::vector<std::string> extra = {"--run-dir", root + "/" + dir, "--resume", "--save-weights",
                                      root + "/" + dir + ".safetensors"};
    extra.insert(extra.end(), flags.begin(), flags.end());
    const auto resumed = run_train_ranks(2, with(extra));
    expect_success(resumed, "resumed " + dir);
    EXPECT_NE(resumed[0].output.find("resuming from"), std::string::npos) << resumed[0].output;
    expect_same_weights(root + "/plain.safetensors", root + "/" + dir + ".safetensors");
  }
}

TEST(TrainProcesses, RankKilledMidEpochIsContinuedFromTheNewestCheckpointToTheSameWeightsAndMetrics) {
  // 160 training samples, batch 16 per rank on 2 ranks: 5 steps per epoch, 15 in all; a checkpoint every 2
  // steps inside an epoch and at each epoch end.
  const std::string data = write_tiny_mnist("midepoch_data", 160, 45);
  const std::string root = make_temp_dir("midepoch_runs");
  const auto args = [&](const std::string& run) {
    return std::vector<std::string>{"--data", data, "--epochs", "3", "--batch-size", "16", "--threads", "1", "--lr",
                                    "0.05", "--seed", "3", "--timeout", "60", "--checkpoint-every", "2",
                                    "--run-dir", root + "/" + run, "--save-weights", root + "/" + run + ".safetensors"};
  };
  expect_success(run_train_ranks(2, args("whole")), "uninterrupted run");

  // Rank 1 dies at the start of step 14 (epoch 2, batch 3): the newest checkpoint is step 12's, inside epoch 2.
  auto killed = run_train_ranks(2, args("killed"), {{"TANDEM_KILL_AT", "step:1:14"}});
  EXPECT_EQ(killed[1].term_signal, SIGKILL) << killed[1].output;
  EXPECT_NE(killed[0].exit_code, 0) << killed[0].output;
  // Started again in the same run dir, without --resume.
  auto again = run_train_ranks(2, args("killed"));
  expect_success(again, "restarted run");
  EXPECT_NE(again[0].output.find("(epoch 2, batch 2, step 12)"), std::string::npos) << again[0].output;
  EXPECT_EQ(again[0].output.find("[epoch 1]"), std::string::npos) << "finished epochs must not run again";

  expect_same_weights(root + "/whole.safetensors", root + "/killed.safetensors");
  // The epoch cut by the kill reports the same loss and accuracy as the uninterrupted one, once.
  const auto metric = [](const std::string& line, const std::string& key) {
    const size_t at = line.find("\"" + key + "\":");
    return at == std::string::npos ? std::string() : line.substr(at, line.find(',', at) - at);
  };
  const auto whole = read_lines(root + "/whole/metrics.jsonl");
  const auto killed_metrics = read_lines(root + "/killed/metrics.jsonl");
  ASSERT_EQ(whole.size(), 3u);
  ASSERT_EQ(killed_metrics.size(), 3u);
  for (size_t e = 0; e < 3; ++e) {
    for (const char* key : {"epoch", "loss", "accuracy", "step"}) {
      EXPECT_EQ(metric(whole[e], key), metric(killed_metrics[e], key)) << "epoch " << e;
    }
  }
  // --keep-checkpoints defaults to 3.
  EXPECT_EQ(checkpoint::list_checkpoints(root + "/killed").size(), 3u);
}

TEST(TrainProcesses, KilledWhileWritingACheckpointLeavesTheNewestCompleteOneToContinueFrom) {
  // One rank, 10 steps per epoch, a checkpoint every 4 steps: writes at steps 4, 8, 10 (epoch end), 14, ...
  const std::string data = write_tiny_mnist("midwrite_data", 80, 20);
  const std::string root = make_temp_dir("midwrite_runs");
  const auto args = [&](const std::string& run) {
    return std::vector<std::string>{"--data", data, "--epochs", "2", "--batch-size", "8", "--threads", "1", "--seed",
                                    "5", "--checkpoint-every", "4", "--run-dir", root + "/" + run,
                                    "--save-weights", root + "/" + run + ".safetensors"};
  };
  expect_success(run_train_ranks(1, args("whole")), "uninterrupted run");

  // Killed half way through writing its third checkpoint (the end of epoch 0).
  auto killed = run_train_ranks(1, args("killed"), {{"TANDEM_KILL_AT", "safetensors-write:0:3"}});
  ASSERT_EQ(killed[0].term_signal, SIGKILL) << killed[0].output;
  const std::string run = root + "/killed";
  bool temp_file_left = false;
  for (const auto& entry : std::filesystem::directory_iterator(run)) {
    temp_file_left = temp_file_left || entry.path().filename().string().find(".tmp.") != std::string::npos;
  }
  EXPECT_TRUE(temp_file_left) << "the kill should have caught the write half way";
  const std::optional<std::string> newest = checkpoint::find_latest_checkpoint(run);
  ASSERT_TRUE(newest.has_value());
  EXPECT_EQ(*newest, checkpoint::checkpoint_path(run, 0, 8));
  checkpoint::TensorFile intact = checkpoint::load_safetensors(*newest);
  EXPECT_EQ(intact.metadata.at("step"), "8");

  auto again = run_train_ranks(1, args("killed"));
  expect_success(again, "restarted run");
  EXPECT_NE(again[0].output.find("(epoch 0, batch 8, step 8)"), std::string::npos) << again[0].output;
  expect_same_weights(root + "/whole.safetensors", root + "/killed.safetensors");
  for (const auto& entry : std::filesystem::directory_iterator(run)) {
    EXPECT_EQ(entry.path().filename().string().find(".tmp."), std::string::npos) << entry.path();
  }
}

TEST(TrainProcesses, RanksWhoseDataDiffersStopBeforeTrainingNamingTheOddRank) {
  const std::string same = write_tiny_mnist("agreement_same", 64, 20);
  const std::string changed = make_temp_dir("agreement_changed");
  std::filesystem::copy(same, changed, std::filesystem::copy_options::recursive);
  {
    // One training label differs: the last byte of the labels file.
    const std::string labels = changed + "/train-labels-idx1-ubyte";
    std::fstream file(labels, std::ios::in | std::ios::out | std::ios::binary);
    ASSERT_TRUE(file) << labels;
    file.seekg(-1, std::ios::end);
    const char label = static_cast<char>(file.get());
    file.seekp(-1, std::ios::end);
    file.put(static_cast<char>(label == 0 ? 1 : 0));
  }
  const auto results = run_train_ranks_with(2, [&](int rank) {
    return std::vector<std::string>{"--data", rank == 1 ? changed : same, "--epochs", "1", "--batch-size", "8",
                                    "--threads", "1", "--timeout", "30", "--run-dir", make_temp_dir("agreement_run")};
  });
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_FALSE(results[r].timed_out) << "rank " << r << " hung:\n" << results[r].output;
    EXPECT_NE(results[r].exit_code, 0) << results[r].output;
    EXPECT_NE(results[r].output.find("training data differ"), std::string::npos) << results[r].output;
    EXPECT_NE(results[r].output.find("ranks [1]"), std::string::npos) << results[r].output;
    EXPECT_EQ(results[r].output.find("[epoch 0]"), std::string::npos) << "no rank may train:\n" << results[r].output;
  }
}

TEST(TrainProcesses, NonFiniteLossOnOneRankStopsEveryRankWithOneMessage) {
  const std::string data = write_tiny_mnist("nan_data", 320, 20);
  auto results = run_train_ranks(2,
                                 {"--data", data, "--epochs", "3", "--batch-size", "16", "--threads", "1",
                                  "--run-dir", make_temp_dir("nan_run"), "--timeout", "60"},
                                 {{"TANDEM_INJECT_NAN_AT_STEP", "1:3"}});
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_FALSE(results[r].timed_out) << "rank " << r << " hung:\n" << results[r].output;
    EXPECT_NE(results[r].exit_code, 0) << "rank " << r << ":\n" << results[r].output;
    EXPECT_NE(results[r].output.find("non-finite loss on rank 1 at step 3"), std::string::npos)
        << "rank " << r << ":\n" << results[r].output;
    EXPECT_EQ(results[r].output.find("[epoch 0] loss"), std::string::npos) << "no epoch may finish after the NaN";
  }
}

// The loss that rank 0 printed for `epoch` ("[epoch E] loss L ..."), or -1.
double printed_loss(const std::string& output, int epoch) {
  const std::string tag = "[epoch " + std::to_string(epoch) + "] loss ";
  const size_t at = output.find(tag);
  return at == std::string::npos ? -1.0 : std::stod(output.substr(at + tag.size()));
}

// `tandem train --device cuda` at world sizes 1 and 2 (two GPUs over nccl, or one shared over gloo) trains the
// same model from the same seed as the CPU does: the first epoch's loss agrees (cuDNN's TF32 convolutions and
// a different summation order leave a small difference, not a different run).
TEST(TrainProcessesOnGpu, OneAndTwoRanksTrainLikeTheCpu) {
  TANDEM_SKIP_WITHOUT_GPU();
  const std::string data = write_tiny_mnist("gpu", 256, 64);
  for (int world : {1, 2}) {
    double losses[2] = {};
    for (const std::string device : {"cpu", "cuda"}) {
      const std::string backend = device == "cuda" ? testing::gpu_test_backend(world) : "gloo";
      auto results = run_train_ranks(world, {"--data", data, "--device", device, "--backend", backend, "--epochs",
                                             "1", "--batch-size", "16", "--threads", "1", "--run-dir",
                                             make_temp_dir("gpu_" + device + std::to_string(world))});
      expect_success(results, "--device " + device + " world " + std::to_string(world));
      EXPECT_NE(results[0].output.find("device:        " + std::string(device == "cuda" ? "cuda:0" : "cpu")),
                std::string::npos)
          << results[0].output;
      losses[device == "cuda"] = printed_loss(results[0].output, 0);
    }
    std::printf("[gpu parity] world %d: epoch-0 loss cpu %.4f cuda %.4f\n", world, losses[0], losses[1]);
    EXPECT_GT(losses[0], 0.0);
    EXPECT_NEAR(losses[1], losses[0], 0.02 * losses[0]) << "world " << world;
  }
}

// Runs `tandem train --data DATA ARGS` alone and expects a failure told in exactly one line holding `expected`.
void expect_one_line_failure(const std::string& name, const std::vector<std::string>& args, const std::string& expected) {
  std::vector<std::string> argv = {testing::tandem_cli(), "train", "--data", write_tiny_mnist(name, 64, 16),
                                   "--epochs", "1", "--threads", "1"};
  argv.insert(argv.end(), args.begin(), args.end());
  const testing::ProcessResult result = testing::run_process(argv);
  ASSERT_FALSE(result.timed_out) << result.output;
  EXPECT_NE(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find(expected), std::string::npos) << result.output;
  EXPECT_EQ(std::count(result.output.begin(), result.output.end(), '\n'), 1) << result.output;
}

// The first GPU mistakes a user can make each get one line that says what is missing and a non-zero exit.
TEST(TrainProcesses, DeviceCudaWithoutAGpuIsOneLineSayingWhatIsMissing) {
  if (visible_gpu_count() > 0) GTEST_SKIP() << "a GPU is visible here";
  expect_one_line_failure("no_gpu", {"--device", "cuda"},
                          cuda_built() ? "--device cuda: no CUDA GPU is visible on this machine"
                                       : "--device cuda: this tandem was built against a CPU-only LibTorch");
}

TEST(TrainProcesses, BackendNcclWithoutAGpuIsOneLine) {
  if (visible_gpu_count() > 0) GTEST_SKIP() << "a GPU is visible here";
  expect_one_line_failure("nccl_no_gpu", {"--backend", "nccl"},
                          cuda_built() ? "backend nccl needs a CUDA GPU, and none is visible"
                                       : "backend 'nccl' is not available in this build of tandem");
}

TEST(TrainProcesses, StrategyDpTrainsTheSeedsCnnInOneProcessWithBf16Mixed) {
  const std::string run_dir = make_temp_dir("train_dp");
  const testing::ProcessResult result = testing::run_process(
      {testing::tandem_cli(), "train", "--data", write_tiny_mnist("dp", 64, 16), "--epochs", "1", "--threads", "1",
       "--strategy", "dp", "--dp-replicas", "3", "--precision", "bf16-mixed", "--run-dir", run_dir},
      {}, std::chrono::seconds(90));
  ASSERT_FALSE(result.timed_out) << result.output;
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("strategy:      dp, 3 replicas"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("precision:     bf16-mixed"), std::string::npos) << result.output;
  EXPECT_EQ(read_lines(run_dir + "/metrics.jsonl").size(), 1u);
}

TEST(TrainProcesses, StrategyDpUnderSeveralRanksIsRefusedOnEveryRank) {
  const auto results = run_train_ranks(2, {"--data", write_tiny_mnist("dp_ranks", 64, 16), "--epochs", "1",
                                           "--threads", "1", "--strategy", "dp"});
  for (const auto& result : results) {
    ASSERT_FALSE(result.timed_out) << result.output;
    EXPECT_NE(result.exit_code, 0) << result.output;
    EXPECT_NE(result.output.find("strategy dp (DataParallel) trains in one process"), std::string::npos) << result.output;
  }
}

TEST(TrainProcesses, UnevenTrainsEverySampleOnceWithRanksOfThreeTwoAndTwoBatches) {
  // 52 samples over 3 ranks: 18, 17 and 17, in batches of 8: 3 batches (8, 8, 2) on rank 0 and 2 (8, 9: a last
  // sample joins the batch before it) on ranks 1 and 2, which shadow each epoch's third step, where the
  // timeline's window (a collective at its end) closes too.
  const std::string root = make_temp_dir("uneven_runs");
  const auto results = run_train_ranks(3, {"--data", write_tiny_mnist("uneven", 52, 16), "--epochs", "2",
                                           "--batch-size", "8", "--threads", "1", "--uneven", "--run-dir",
                                           root + "/run", "--timeline", root + "/trace.json", "--timeline-steps",
                                           "2-3", "--timeout", "60"});
  expect_success(results, "uneven run");
  EXPECT_NE(results[0].output.find("uneven inputs:"), std::string::npos) << results[0].output;
  EXPECT_EQ(read_lines(root + "/run/metrics.jsonl").size(), 2u);
  EXPECT_EQ(read_lines(root + "/run/steps.jsonl").size(), 6u) << "3 steps per epoch, counted once";
  EXPECT_TRUE(std::filesystem::exists(root + "/trace.json"));
}

TEST(TrainProcesses, UnevenWithBf16MixedTrainsEveryRankToTheEnd) {
  const std::string root = make_temp_dir("uneven_bf16_runs");
  const auto results = run_train_ranks(3, {"--data", write_tiny_mnist("uneven_bf16", 52, 16), "--epochs", "1",
                                           "--batch-size", "8", "--threads", "1", "--uneven", "--precision",
                                           "bf16-mixed", "--run-dir", root + "/run", "--timeout", "60"});
  expect_success(results, "uneven bf16-mixed run");
  EXPECT_EQ(read_lines(root + "/run/steps.jsonl").size(), 3u);
}

TEST(TrainProcesses, UnevenWithStepsIsOneLine) {
  expect_one_line_failure("uneven_steps", {"--uneven", "--steps", "3"}, "--uneven cannot be combined with --steps");
}

// --uneven with --zero trains (every rank steps its shard, shadowing or not: tests/matrix); with PowerSGD it is
// refused, since a shadowing rank would still send its error feedback.
TEST(TrainProcesses, UnevenWithPowerSgdIsOneLine) {
  expect_one_line_failure("uneven_powersgd", {"--uneven", "--comm-hook", "powersgd"},
                          "--uneven cannot be combined with --comm-hook powersgd");
}

TEST(TrainProcesses, SyncBatchNormOnAModelWithoutBatchNormIsOneLine) {
  expect_one_line_failure("sync_bn_cnn", {"--sync-bn"}, "--sync-bn: model 'cnn' has no BatchNorm layers");
}

TEST(TrainProcesses, SyncBatchNormWithStrategyDpIsOneLine) {
  expect_one_line_failure("dp_sync_bn", {"--strategy", "dp", "--sync-bn"}, "--sync-bn needs --strategy ddp");
}

TEST(TrainProcesses, DpReplicasWithoutStrategyDpIsOneLine) {
  expect_one_line_failure("dp_replicas_ddp", {"--dp-replicas", "2"}, "--dp-replicas needs --strategy dp");
}

TEST(TrainProcesses, ZeroWithStrategyDpIsOneLine) {
  expect_one_line_failure("zero_dp", {"--strategy", "dp", "--zero"}, "--zero needs --strategy ddp");
}

#if TORCH_VERSION_MAJOR < 2
TEST(TrainProcesses, Float16MixedOnLibTorch113sCpuIsOneLineNamingTheAlternative) {
  expect_one_line_failure("fp16_113", {"--precision", "16-mixed"}, "use --precision bf16-mixed");
}
#endif

}  // namespace
}  // namespace tandem::train
