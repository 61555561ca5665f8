// Issue 44, side by side with PyTorch 2.11 (the checkout's .venv, tests/fixtures/pytorch_checkpoints.py): a
// distributed checkpoint that FSDP2 saved on 2 ranks is read by tandem whole; a sharded tandem checkpoint converted to
// DCP loads in PyTorch on 1 and on 2 ranks; sharded safetensors that PyTorch's Hugging Face writer saved are read by
// tandem, and what tandem writes is read the way transformers reads it. tests/checkpoint/pytorch_formats_test.cpp
// has the formats' own tests and their damage.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "support/processes.h"
#include "support/tiny_datasets.h"
#include "support/venv_python.h"
#include "support/weight_files.h"
#include "tandem/checkpoint/distributed_checkpoint.h"
#include "tandem/checkpoint/safetensors.h"
#include "tandem/checkpoint/sharded_safetensors.h"

namespace tandem::app {
namespace {

constexpr const char* kScript = "tests/fixtures/pytorch_checkpoints.py";

void expect_success(const testing::ProcessResult& result) {
  ASSERT_FALSE(result.timed_out) << result.output;
  ASSERT_EQ(result.exit_code, 0) << result.output;
}

testing::ProcessResult pytorch(const std::vector<std::string>& args) {
  return testing::run_venv_python(kScript, args, std::chrono::seconds(120));
}

testing::ProcessResult tandem(std::vector<std::string> args) {
  args.insert(args.begin(), testing::tandem_cli());
  return testing::run_process(args, {}, std::chrono::seconds(120));
}

// The model part of `reference` (PyTorch's names, no optimizer.*) equals `actual` tensor for tensor, bit for bit.
void expect_same_model(const checkpoint::TensorFile& reference, const checkpoint::TensorFile& actual) {
  size_t compared = 0;
  for (const auto& [name, tensor] : reference.tensors) {
    if (name.rfind("optimizer.", 0) == 0) continue;
    const torch::Tensor other = actual.find(name);
    ASSERT_TRUE(other.defined()) << name << " is missing";
    EXPECT_TRUE(torch::equal(tensor, other)) << name << " differs";
    ++compared;
  }
  EXPECT_EQ(compared, 12u) << "the seeds' CNN has 12 tensors";
  EXPECT_EQ(actual.tensors.size(), compared);
}

TEST(PytorchCheckpoints, AnFsdp2DistributedCheckpointOfTwoRanksIsReadWholeByConvertAndByInit) {
  const std::string dir = testing::make_temp_dir("pytorch_dcp_to_tandem");
  expect_success(pytorch({"save-dcp", "--out", dir + "/dcp", "--reference", dir + "/ref.safetensors", "--steps", "3"}));
  ASSERT_TRUE(checkpoint::is_distributed_checkpoint(dir + "/dcp"));

  expect_success(tandem({"convert", dir + "/dcp", dir + "/converted", "--format", "safetensors"}));
  expect_same_model(checkpoint::load_safetensors(dir + "/ref.safetensors"),
                    checkpoint::read_sharded_safetensors(dir + "/converted"));

  const std::string data = testing::write_tiny_mnist("pytorch_dcp_to_tandem_data", 32, 16);
  const testing::ProcessResult init =
      tandem({"train", "--data", data, "--init", dir + "/dcp", "--strict", "--steps", "1", "--batch-size", "8",
              "--no-tensorboard", "--no-report", "--run-dir", dir + "/run"});
  expect_success(init);
  EXPECT_NE(init.output.find("loaded 12 tensors from " + dir + "/dcp"), std::string::npos) << init.output;

  // Its AdamW state continues only in an AdamW of the same hyper-parameters.
  const std::vector<std::pair<std::vector<std::string>, std::string>> refusals = {
      {{}, "holds the state of AdamW, and this run's optimizer is SGD: continue with --optimizer adamw"},
      {{"--optimizer", "adamw"}, "was saved with --weight-decay 0.01, and this run's is 0.005"}};
  for (const auto& [flags, line] : refusals) {
    std::vector<std::string> argv = {"train", "--data", data, "--init", dir + "/dcp", "--init-optimizer", "--steps",
                                     "1", "--no-tensorboard", "--no-report", "--run-dir", dir + "/refused"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    const testing::ProcessResult refused = tandem(argv);
    EXPECT_NE(refused.exit_code, 0) << refused.output;
    EXPECT_NE(refused.output.find(line), std::string::npos) << refused.output;
  }
}

TEST(PytorchCheckpoints, ATandemShardedCheckpointConvertedToDcpLoadsInPytorchOnOneAndOnTwoRanks) {
  const std::string dir = testing::make_temp_dir("tandem_sharded_to_dcp");
  const std::string data = testing::write_tiny_mnist("tandem_sharded_to_dcp_data", 64, 16);
  const testing::ProcessResult run = tandem(
      {"run", "--nproc-per-node", "2", "--", testing::tandem_cli(), "train", "--strategy", "fsdp",
       "--checkpoint-format", "sharded", "--data", data, "--steps", "3", "--batch-size", "8", "--threads", "1",
       "--no-tensorboard", "--no-report", "--run-dir", dir + "/run", "--save-weights", dir + "/final.safetensors"});
  expect_success(run);
  // fsdp's flat shards cut fc1.weight mid-row: its pieces become several boxes each.
  expect_success(tandem({"convert", dir + "/run/checkpoint-0000-00000003.safetensors", dir + "/dcp", "--format", "dcp"}));
  const checkpoint::TensorFile final_weights = checkpoint::load_safetensors(dir + "/final.safetensors");
  for (const std::string ranks : {"1", "2"}) {
    const std::string out = dir + "/pytorch-" + ranks + ".safetensors";
    expect_success(pytorch({"load-dcp", "--dcp", dir + "/dcp", "--out", out, "--ranks", ranks}));
    expect_same_model(final_weights, checkpoint::load_safetensors(out));
  }
}

TEST(PytorchCheckpoints, PytorchsHuggingFaceWriterReadsIntoTandemAndTandemsShardsReadAsTransformersReadsThem) {
  const std::string dir = testing::make_temp_dir("hf_safetensors");
  expect_success(pytorch({"save-hf", "--out", dir + "/hf", "--reference", dir + "/ref.safetensors"}));
  // Each rank's pieces, with DCP_SHARDING_INFO and no index, written back as files of at most 200 kB with an index.
  expect_success(tandem({"convert", dir + "/hf", dir + "/sharded", "--format", "safetensors", "--max-shard-size",
                         "200KB"}));
  const testing::ProcessResult check =
      pytorch({"check-sharded", "--dir", dir + "/sharded", "--against", dir + "/ref.safetensors"});
  expect_success(check);
  EXPECT_NE(check.output.find("\"equal\": true"), std::string::npos) << check.output;
  EXPECT_EQ(check.output.find("\"files\": 1,"), std::string::npos) << "200 kB must take several files: " << check.output;
}

// The continuations below: 288 training images (24 steps of 12 in epoch 0 on any of 1, 2 or 3 ranks), a global
// batch of 12, AdamW at a constant learning rate.
constexpr int kGlobalBatch = 12;
constexpr double kLr = 1e-3;
constexpr double kWeightDecay = 0.01;
constexpr const char* kSeed = "3";
constexpr const char* kNormalize = "0.2860,0.3530";

// `tandem train` on `ranks` processes (fsdp above one) continuing from `init` with --init-optimizer, or from the run
// dir's own checkpoint when `init` is empty, until step `steps`; its final weights in `out`.
testing::ProcessResult tandem_continues(const std::string& data, int ranks, const std::string& init, int steps,
                                        const std::string& run_dir, const std::string& out,
                                        const std::vector<std::string>& more = {}) {
  std::vector<std::string> argv;
  if (ranks > 1) argv = {"run", "--nproc-per-node", std::to_string(ranks), "--", testing::tandem_cli()};
  // tandem's rate is per rank (times the world size): the same global rate as PyTorch's on every world size.
  const std::vector<std::string> train = {
      "train", "--data", data, "--optimizer", "adamw", "--lr", fmt::format("{:.17g}", kLr / ranks), "--lrf", "1",
      "--weight-decay", fmt::format("{:.17g}", kWeightDecay), "--steps", std::to_string(steps), "--batch-size",
      std::to_string(kGlobalBatch / ranks), "--seed", kSeed, "--normalize", kNormalize, "--threads", "1",
      "--no-tensorboard", "--no-report", "--run-dir", run_dir, "--save-weights", out};
  argv.insert(argv.end(), train.begin(), train.end());
  if (ranks > 1) argv.insert(argv.end(), {"--strategy", "fsdp"});
  if (!init.empty()) argv.insert(argv.end(), {"--init", init, "--init-optimizer", "--strict"});
  argv.insert(argv.end(), more.begin(), more.end());
  return tandem(argv);
}

testing::ProcessResult pytorch_continues(const std::string& dcp, const std::string& data, int skip_steps,
                                         const std::string& out) {
  return pytorch({"continue-dcp", "--dcp", dcp, "--data", data, "--out", out, "--steps", "10", "--skip-steps",
                  std::to_string(skip_steps), "--batch-size", std::to_string(kGlobalBatch / 2), "--lr",
                  fmt::format("{:.17g}", kLr), "--weight-decay", fmt::format("{:.17g}", kWeightDecay), "--seed", kSeed,
                  "--normalize", kNormalize});
}

// The model's tensors of a file (save-dcp's reference holds the optimizer's state too).
checkpoint::TensorFile model_part(const std::string& path) {
  checkpoint::TensorFile file = checkpoint::load_safetensors(path);
  checkpoint::TensorFile model;
  for (auto& [name, tensor] : file.tensors) {
    if (name.rfind("optimizer.", 0) != 0) model.tensors.emplace_back(name, tensor);
  }
  return model;
}

double model_distance(const std::string& expected, const std::string& actual) {
  return testing::weights_relative_l2(model_part(expected), model_part(actual));
}

// The first "Done when": FSDP2 trains 10 AdamW steps on 2 ranks and saves DCP; PyTorch continues 10 steps
// from it, and tandem continues the same 10 (same batches, rate, order) on 1 and on 3 ranks.
TEST(PytorchCheckpoints, AnFsdp2RunOfPytorchContinuesInTandemOnOneAndThreeRanksWithinOneInAHundredThousand) {
  const std::string dir = testing::make_temp_dir("pytorch_run_continued");
  const std::string data = testing::write_tiny_mnist("pytorch_run_continued_data", 288, 16);
  expect_success(pytorch({"save-dcp", "--out", dir + "/dcp", "--reference", dir + "/ref.safetensors", "--steps", "10"}));
  expect_success(pytorch_continues(dir + "/dcp", data, 0, dir + "/pytorch.safetensors"));
  EXPECT_GT(model_distance(dir + "/ref.safetensors", dir + "/pytorch.safetensors"), 1e-3) << "PyTorch hardly trained";
  for (int ranks : {1, 3}) {
    const std::string out = dir + "/tandem-" + std::to_string(ranks) + ".safetensors";
    const testing::ProcessResult run =
        tandem_continues(data, ranks, dir + "/dcp", 10, dir + "/run-" + std::to_string(ranks), out);
    expect_success(run);
    EXPECT_NE(run.output.find("continued AdamW's state from " + dir + "/dcp: 12 parameters at step 10"),
              std::string::npos) << run.output;
    const double difference = model_distance(dir + "/pytorch.safetensors", out);
    std::printf("[pytorch -> tandem] %d ranks: relative L2 %.3g after 10 steps continued\n", ranks, difference);
    EXPECT_LT(difference, 1e-5) << ranks << " ranks";
  }
}

// The reverse: tandem trains 10 steps under fsdp, each rank writing its own checkpoint file, and converts the
// checkpoint to DCP (each rank file's pieces, the step from the index's checkpoint file); PyTorch continues 10 steps
// from it, and ends where tandem continuing its own run dir ends.
TEST(PytorchCheckpoints, ATandemRunContinuesInPytorchWhereItWouldHaveGoneOnItself) {
  const std::string dir = testing::make_temp_dir("tandem_run_continued");
  const std::string data = testing::write_tiny_mnist("tandem_run_continued_data", 288, 16);
  const std::vector<std::string> sharded = {"--checkpoint-format", "sharded"};
  expect_success(tandem_continues(data, 2, "", 10, dir + "/run", dir + "/at-10.safetensors", sharded));
  expect_success(tandem({"convert", dir + "/run/checkpoint-0000-00000010.safetensors", dir + "/dcp", "--format",
                         "dcp"}));
  expect_success(pytorch_continues(dir + "/dcp", data, 10, dir + "/pytorch.safetensors"));
  const testing::ProcessResult resumed =
      tandem_continues(data, 2, "", 20, dir + "/run", dir + "/tandem.safetensors", sharded);
  expect_success(resumed);
  EXPECT_NE(resumed.output.find("resuming from"), std::string::npos) << resumed.output;
  EXPECT_GT(model_distance(dir + "/at-10.safetensors", dir + "/tandem.safetensors"), 1e-3) << "tandem hardly trained";
  const double difference = model_distance(dir + "/tandem.safetensors", dir + "/pytorch.safetensors");
  std::printf("[tandem -> pytorch] relative L2 %.3g after 10 steps continued\n", difference);
  EXPECT_LT(difference, 1e-5);
}

}  // namespace
}  // namespace tandem::app
