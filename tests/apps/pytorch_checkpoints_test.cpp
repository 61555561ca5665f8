// Issue 44, side by side with PyTorch 2.11 (the checkout's .venv, tests/fixtures/pytorch_checkpoints.py): a
// distributed checkpoint that FSDP2 saved on 2 ranks is read by tandem whole; a sharded tandem checkpoint converted to
// DCP loads in PyTorch on 1 and on 2 ranks; sharded safetensors that PyTorch's Hugging Face writer saved are read by
// tandem, and what tandem writes is read the way transformers reads it. tests/checkpoint/pytorch_formats_test.cpp
// has the formats' own tests and their damage.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "support/processes.h"
#include "support/tiny_datasets.h"
#include "support/venv_python.h"
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

}  // namespace
}  // namespace tandem::app
