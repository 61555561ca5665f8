// `tandem train` on bad input, through the built binary on tiny data: a damaged label, an --init file that fits
// nothing, an output path that cannot be written. Each used to train on (to the end, or to a failure after it);
// each now stops before the first step with one line and a non-zero exit. A PyTorch DDP state dict as --init
// loads, and so does a checkpoint's model, full or sharded. Each --comm-hook trains 2 ranks to equal replicas.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/version.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "support/processes.h"
#include "support/tiny_datasets.h"
#include "tandem/checkpoint/checkpoint_folder.h"
#include "tandem/checkpoint/safetensors.h"
#include "tandem/checkpoint/weights.h"
#include "tandem/nn/model_registry.h"

namespace tandem::app {
namespace {

namespace fs = std::filesystem;
using testing::make_temp_dir;
using testing::write_tiny_mnist;

struct TrainRun {
  testing::ProcessResult result;
  std::string run_dir;
};

// `tandem train` for one epoch of 32 tiny samples (or `data`) into `run_dir` (empty: a fresh one), plus `args`.
TrainRun train(const std::string& name, const std::vector<std::string>& args, const std::string& data = "",
               const std::string& run_dir = "") {
  TrainRun run;
  run.run_dir = run_dir.empty() ? make_temp_dir(name + "_run") + "/run" : run_dir;
  std::vector<std::string> argv = {testing::tandem_cli(), "train", "--data",
                                   data.empty() ? write_tiny_mnist(name, 32, 8) : data, "--epochs", "1",
                                   "--batch-size", "8", "--threads", "1", "--no-tensorboard", "--run-dir", run.run_dir};
  argv.insert(argv.end(), args.begin(), args.end());
  run.result = testing::run_process(argv, {}, std::chrono::seconds(60));
  return run;
}

// Refused before the first step: a non-zero exit, exactly one line holding `expected`, and no trace of training
// (no configuration printed, no epoch, no metrics written).
void expect_refused_before_training(const TrainRun& run, const std::string& expected) {
  const testing::ProcessResult& result = run.result;
  ASSERT_FALSE(result.timed_out) << result.output;
  EXPECT_NE(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find(expected), std::string::npos) << result.output;
  EXPECT_EQ(std::count(result.output.begin(), result.output.end(), '\n'), 1) << result.output;
  EXPECT_EQ(result.output.find("[epoch"), std::string::npos) << result.output;
  EXPECT_FALSE(fs::exists(run.run_dir + "/metrics.jsonl")) << "training started";
}

void expect_trained(const TrainRun& run) {
  ASSERT_FALSE(run.result.timed_out) << run.result.output;
  EXPECT_EQ(run.result.exit_code, 0) << run.result.output;
  EXPECT_NE(run.result.output.find("[epoch 0]"), std::string::npos) << run.result.output;
}

// Byte `index` of the labels in an uncompressed IDX labels file (after its 8-byte header) set to `label`.
void damage_label(const std::string& labels_file, int index, unsigned char label) {
  std::fstream file(labels_file, std::ios::in | std::ios::out | std::ios::binary);
  file.seekp(8 + index);
  file.put(static_cast<char>(label));
}

// One damaged byte in the labels gave "cnn, 201 classes" and a run that ended with exit 0.
TEST(TrainCommand, LabelOutsideTheTenMnistClassesIsOneLineNamingTheFileAndTheValue) {
  const std::string data = write_tiny_mnist("bad_label", 32, 8);
  damage_label(data + "/train-labels-idx1-ubyte", 5, 200);
  expect_refused_before_training(
      train("bad_label", {}, data),
      data + "/train-labels-idx1-ubyte: label 200 at index 5 is outside the 10 classes 0-9");
  // With as many classes as the label asks for, the data is taken as it is.
  expect_trained(train("bad_label_classes", {"--num-classes", "201"}, data));
}

// The cnn's state dict with every name behind `prefix`, as a safetensors file.
std::string write_cnn_weights(const std::string& name, const std::string& prefix) {
  nn::Model model = nn::make_model("cnn", nn::ModelOptions{10, 1, 28});
  std::vector<std::pair<std::string, torch::Tensor>> state;
  for (const auto& [tensor_name, tensor] : checkpoint::named_state(*model.module.ptr())) {
    state.emplace_back(prefix + tensor_name, tensor);
  }
  const std::string path = make_temp_dir(name) + "/weights.safetensors";
  checkpoint::save_safetensors(path, state);
  return path;
}

// PyTorch's DistributedDataParallel saves its state dict with "module." before every name; such a file loaded 0
// tensors and the run trained from scratch with exit 0.
TEST(TrainCommand, InitFromAPyTorchDdpStateDictLoadsEveryTensor) {
  const std::string weights = write_cnn_weights("ddp_init", "module.");
  const TrainRun run = train("ddp_init", {"--init", weights, "--strict"});
  expect_trained(run);
  const size_t tensors = checkpoint::load_safetensors(weights).tensors.size();
  EXPECT_NE(run.result.output.find("loaded " + std::to_string(tensors) + " tensors from " + weights),
            std::string::npos)
      << run.result.output;
}

TEST(TrainCommand, InitThatLoadsNoTensorIsOneLine) {
  const std::string weights = write_cnn_weights("unrelated_init", "encoder.");
  const size_t tensors = checkpoint::load_safetensors(weights).tensors.size();
  expect_refused_before_training(train("unrelated_init", {"--init", weights}),
                                 weights + ": none of its " + std::to_string(tensors) + " tensors fits the model");
}

// --init takes a checkpoint's model, full or sharded: a sharded checkpoint's file holds no parameters (they lie in
// its rank files), so --init found none of its tensors fitting and refused it, or with BatchNorm loaded the buffers
// alone and trained the rest from scratch.
TEST(TrainCommand, InitFromAFullOrShardedCheckpointLoadsTheModelItSaved) {
  const std::string data = write_tiny_mnist("init_checkpoint", 32, 8);
  for (const std::string format : {"full", "sharded"}) {
    const std::string source = make_temp_dir("init_checkpoint_" + format) + "/run";
    const std::string saved = source + "-weights.safetensors";
    const testing::ProcessResult trained = testing::run_process(
        {testing::tandem_cli(), "run", "--nproc-per-node", "2", "--", testing::tandem_cli(), "train", "--data", data,
         "--model", "cnn-bn", "--epochs", "1", "--batch-size", "8", "--threads", "1", "--no-tensorboard",
         "--strategy", "fsdp", "--checkpoint-format", format, "--run-dir", source, "--save-weights", saved},
        {}, std::chrono::seconds(60));
    ASSERT_EQ(trained.exit_code, 0) << trained.output;
    const std::optional<std::string> checkpoint = checkpoint::find_latest_checkpoint(source);
    ASSERT_TRUE(checkpoint) << source;

    // The model the checkpoint holds is the one the run saved at its end, tensor for tensor.
    const checkpoint::TensorFile weights = checkpoint::load_safetensors(saved);
    const checkpoint::TensorFile model = checkpoint::read_model_weights(*checkpoint);
    ASSERT_EQ(model.tensors.size(), weights.tensors.size()) << format;
    for (const auto& [name, tensor] : weights.tensors) {
      ASSERT_TRUE(model.find(name).defined()) << format << ": " << name;
      EXPECT_TRUE(torch::equal(model.find(name), tensor)) << format << ": " << name;
    }
    const TrainRun run = train("init_from_" + format, {"--model", "cnn-bn", "--init", *checkpoint, "--strict"}, data);
    expect_trained(run);
    EXPECT_NE(run.result.output.find(fmt::format("loaded {} tensors from {}", weights.tensors.size(), *checkpoint)),
              std::string::npos)
        << run.result.output;
  }
}

TEST(TrainCommand, SaveWeightsIntoAMissingFolderIsOneLineBeforeTraining) {
  const std::string missing = make_temp_dir("save_missing") + "/no/such/folder/weights.safetensors";
  expect_refused_before_training(train("save_missing", {"--save-weights", missing}),
                                 "--save-weights " + missing + ": the folder ");
}

// A timeline path that is a folder passed the check of its parent and failed when the trace was written.
TEST(TrainCommand, TimelineThatCannotBeWrittenIsOneLineBeforeTraining) {
  const std::string folder = make_temp_dir("timeline_folder");
  expect_refused_before_training(train("timeline_folder", {"--timeline", folder}),
                                 "--timeline " + folder + ": is a folder");
  const std::string missing = folder + "/missing/trace.json";
  expect_refused_before_training(train("timeline_missing", {"--timeline", missing}),
                                 "--timeline " + missing + ": the folder ");
}

TEST(TrainCommand, RunDirUnderAFileIsOneLineBeforeTraining) {
  const std::string file = make_temp_dir("run_dir_file") + "/plain_file";
  std::ofstream(file) << "not a folder";
  const std::string run_dir = file + "/run";
  expect_refused_before_training(train("run_dir_file", {}, "", run_dir),
                                 "--run-dir " + run_dir + ": " + file + " is not a folder");
}

TEST(TrainCommand, ReportThatCannotBeWrittenIsOneLineBeforeTraining) {
  const std::string run_dir = make_temp_dir("report_folder");
  fs::create_directories(run_dir + "/report.html");
  expect_refused_before_training(train("report_folder", {}, "", run_dir), run_dir + "/report.html: is a folder");
}

// Users choose a comm hook for real training: each one trains 2 ranks under tandem run, with the replicas compared
// after every step (a difference stops the run), and the run says which hook it used. Gloo in LibTorch 1.13 cannot
// reduce bfloat16, so there the bf16 hook is refused up front in one line.
TEST(TrainCommand, EachCommHookTrainsTwoRanksToEqualReplicas) {
  const std::string data = write_tiny_mnist("comm_hooks", 64, 8);
  for (const std::string hook : {"average", "fp16", "bf16", "powersgd"}) {
    SCOPED_TRACE(hook);
    const std::string run_dir = make_temp_dir("comm_hook_" + hook) + "/run";
    std::vector<std::string> argv = {testing::tandem_cli(), "run", "--nproc-per-node", "2", "--",
                                     testing::tandem_cli(), "train", "--data", data, "--epochs", "2", "--batch-size",
                                     "8", "--threads", "1", "--no-tensorboard", "--no-report", "--run-dir", run_dir,
                                     "--comm-hook", hook, "--check-replicas-every", "1", "--timeout", "60"};
    // Only the powersgd hook reads its start step (the others refuse it).
    if (hook == "powersgd") argv.insert(argv.end(), {"--powersgd-start", "2"});
    const testing::ProcessResult result = testing::run_process(argv, {}, std::chrono::seconds(120));
    ASSERT_FALSE(result.timed_out) << result.output;
    if (hook == "bf16" && TORCH_VERSION_MAJOR < 2) {
      EXPECT_NE(result.exit_code, 0) << result.output;
      EXPECT_NE(result.output.find("--comm-hook bf16 needs a backend that reduces bfloat16"), std::string::npos)
          << result.output;
      continue;
    }
    EXPECT_EQ(result.exit_code, 0) << result.output;
    EXPECT_NE(result.output.find(fmt::format("  {:<14} {}", "comm hook:", hook)), std::string::npos) << result.output;
    EXPECT_NE(result.output.find("[epoch 1]"), std::string::npos) << result.output;
  }
}

}  // namespace
}  // namespace tandem::app
