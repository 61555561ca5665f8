// Checkpoints restore model and optimizer exactly (the next step after loading equals the next step of the
// original), for any optimizer, refuse another kind of optimizer, a damaged entry or metadata value (by their
// checksums) and a link planted in their place.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "support/tiny_datasets.h"
#include "tandem/checkpoint/checkpoint.h"
#include "tandem/checkpoint/checkpoint_damage.h"
#include "tandem/checkpoint/checkpoint_folder.h"
#include "tandem/checkpoint/rng_state.h"
#include "tandem/checkpoint/safetensors.h"
#include "tandem/checkpoint/weights.h"
#include "tandem/nn/cnn_net.h"
#include "tandem/util/error.h"

namespace tandem::checkpoint {
namespace {

using testing::make_temp_dir;

using CnnOptimizerFactory = std::function<std::unique_ptr<torch::optim::Optimizer>(nn::CnnNet&)>;

std::unique_ptr<torch::optim::Optimizer> make_sgd(nn::CnnNet& net) {
  return std::make_unique<torch::optim::SGD>(net->parameters(),
                                             torch::optim::SGDOptions(0.05).momentum(0.9).weight_decay(0.005));
}

void train_step(nn::CnnNet& net, torch::optim::Optimizer& optimizer, int64_t seed) {
  torch::manual_seed(seed);
  torch::Tensor x = torch::randn({4, 1, 28, 28});
  torch::Tensor y = torch::randint(0, 10, {4});
  optimizer.zero_grad();
  torch::nn::functional::cross_entropy(net->forward(x), y).backward();
  optimizer.step();
}

CheckpointState sample_state() {
  CheckpointState state;
  state.epoch = 2;
  state.batches_done = 0;
  state.step = 2;
  state.lr = 0.05;
  state.base_lr = 0.05;
  state.lrf = 0.1;
  state.epochs = 10;
  state.sampler_seed = 42;
  state.world_size = 2;
  return state;
}

struct CnnOptimizerCase {
  const char* name;
  CnnOptimizerFactory make;
};

class CheckpointOfOptimizer : public ::testing::TestWithParam<CnnOptimizerCase> {};

// The optimizer's whole state comes back (SGD momentum; Adam's moments and step counts, AdamW's too): the step
// after a load equals the original's next step bit for bit.
TEST_P(CheckpointOfOptimizer, RestoresWeightsAndStateSoTheNextStepIsIdentical) {
  const std::string dir = make_temp_dir(std::string("restore_") + GetParam().name);
  torch::manual_seed(1);
  nn::CnnNet original;
  auto optimizer = GetParam().make(original);
  train_step(original, *optimizer, 10);
  train_step(original, *optimizer, 11);
  const std::string path = checkpoint_path(dir, 2, 0);
  save_checkpoint(path, *original, *optimizer, sample_state());

  torch::manual_seed(2);  // different initial weights: everything must come from the file
  nn::CnnNet restored;
  auto restored_optimizer = GetParam().make(restored);
  CheckpointState loaded = load_checkpoint(path, *restored, *restored_optimizer);
  EXPECT_EQ(loaded.epoch, 2);
  EXPECT_EQ(loaded.step, 2);
  EXPECT_EQ(loaded.sampler_seed, 42u);
  EXPECT_EQ(loaded.world_size, 2);
  EXPECT_DOUBLE_EQ(loaded.lr, 0.05);

  train_step(original, *optimizer, 12);
  train_step(restored, *restored_optimizer, 12);
  auto a = original->named_parameters(), b = restored->named_parameters();
  for (const auto& item : a) {
    EXPECT_TRUE(torch::equal(item.value(), b[item.key()])) << item.key() << " differs after the step following a load";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Optimizers, CheckpointOfOptimizer,
    ::testing::Values(
        CnnOptimizerCase{"SGD", make_sgd},
        CnnOptimizerCase{"Adam",
                      [](nn::CnnNet& net) -> std::unique_ptr<torch::optim::Optimizer> {
                        return std::make_unique<torch::optim::Adam>(net->parameters(), torch::optim::AdamOptions(1e-3));
                      }},
        CnnOptimizerCase{"AdamW",
                      [](nn::CnnNet& net) -> std::unique_ptr<torch::optim::Optimizer> {
                        return std::make_unique<torch::optim::AdamW>(net->parameters(),
                                                                     torch::optim::AdamWOptions(1e-3).weight_decay(0.05));
                      }},
        CnnOptimizerCase{"RMSprop",
                      [](nn::CnnNet& net) -> std::unique_ptr<torch::optim::Optimizer> {
                        return std::make_unique<torch::optim::RMSprop>(net->parameters(),
                                                                       torch::optim::RMSpropOptions(1e-3).momentum(0.9));
                      }}),
    [](const ::testing::TestParamInfo<CnnOptimizerCase>& info) { return std::string(info.param.name); });

std::string load_error(const std::string& path, nn::CnnNet& net, torch::optim::Optimizer& optimizer) {
  try {
    load_checkpoint(path, *net, optimizer);
  } catch (const InvalidArgument& error) {
    return error.what();
  }
  return "";
}

// A checkpoint of `net` after one step of `optimizer`, in a fresh folder named `name`; returns its path.
std::string checkpoint_after_one_step(const std::string& name, nn::CnnNet& net, torch::optim::Optimizer& optimizer) {
  train_step(net, optimizer, 1);
  const std::string path = checkpoint_path(make_temp_dir(name), 1, 0);
  save_checkpoint(path, *net, optimizer, sample_state());
  return path;
}

// Rewrites the checkpoint at `path` as one of the format before checksums (tandem-checkpoint-2), after `change`:
// how the checks behind the checksums are reached.
void rewrite_without_checksums(const std::string& path, const std::function<void(TensorFile&)>& change = {}) {
  TensorFile file = load_safetensors(path);
  for (auto it = file.metadata.begin(); it != file.metadata.end();) {
    it = it->first.rfind("crc32c.", 0) == 0 ? file.metadata.erase(it) : std::next(it);
  }
  file.metadata["format"] = "tandem-checkpoint-2";
  if (change) change(file);
  save_safetensors(path, file.tensors, file.metadata);
}

TEST(Checkpoint, ResumingWithAnotherKindOfOptimizerIsOneLineNamingBoth) {
  nn::CnnNet net;
  auto sgd = make_sgd(net);
  const std::string path = checkpoint_after_one_step("other_kind", net, *sgd);
  torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(1e-3));
  const std::string error = load_error(path, net, adam);
  EXPECT_NE(error.find("torch::optim::SGD"), std::string::npos) << error;
  EXPECT_NE(error.find("torch::optim::Adam"), std::string::npos) << error;
  EXPECT_NE(error.find(path), std::string::npos) << error;
  EXPECT_EQ(error.find('\n'), std::string::npos) << error;
}

TEST(Checkpoint, ADamagedOptimizerStateIsRefusedBeforeLibTorchParsesIt) {
  nn::CnnNet net;
  auto sgd = make_sgd(net);
  const std::string path = checkpoint_after_one_step("damaged_optimizer", net, *sgd);
  const auto damage_archive = [](TensorFile& file) {
    for (auto& [name, tensor] : file.tensors) {
      if (name == "optimizer.archive") tensor.data_ptr<uint8_t>()[tensor.numel() / 2] ^= 0x5a;
    }
  };
  TensorFile file = load_safetensors(path);
  damage_archive(file);
  save_safetensors(path, file.tensors, file.metadata);
  std::string error = load_error(path, net, *sgd);
  EXPECT_NE(error.find("entry 'optimizer.archive' does not match its checksum"), std::string::npos) << error;
  // A checkpoint without checksums has the archive's own fingerprint.
  rewrite_without_checksums(path);
  error = load_error(path, net, *sgd);
  EXPECT_NE(error.find("optimizer state is missing or damaged"), std::string::npos) << error;
}

// An archive whose fingerprint and checksums match but whose state was saved for parameters of other shapes (a
// writer that is not tandem): LibTorch hands each parameter the state at its position without looking, and the
// next step would broadcast a momentum buffer of another shape into the weights.
TEST(Checkpoint, AnOptimizerStateOfAnotherShapeIsDamageNamingTheFile) {
  torch::manual_seed(3);
  torch::nn::Linear net(4, 2);
  torch::Tensor other_weight = torch::randn({3, 3}, torch::requires_grad()), other_bias = torch::randn({2}, torch::requires_grad());
  torch::optim::SGD other(std::vector<torch::Tensor>{other_weight, other_bias}, torch::optim::SGDOptions(0.1).momentum(0.9));
  other_weight.mutable_grad() = torch::ones_like(other_weight);
  other_bias.mutable_grad() = torch::ones_like(other_bias);
  other.step();
  const std::string path = make_temp_dir("misfit_optimizer") + "/checkpoint-0001-00000000.safetensors";
  save_checkpoint(path, *net, other, CheckpointState{});
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  std::string error;
  try {
    load_checkpoint(path, *net, sgd);
  } catch (const InvalidArgument& refused) {
    error = refused.what();
  }
  EXPECT_NE(error.find(path + ": the optimizer state of parameter 1 is a tensor of shape [3, 3], the parameter's is "
                              "[2, 4] (the file is damaged)"),
            std::string::npos)
      << error;
  EXPECT_EQ(error.find('\n'), std::string::npos) << error;
}

// The optimizer's archive names parameters by addresses that 1.x writes in hex and 2.x reads as decimal.
TEST(Checkpoint, ACheckpointOfAnotherLibTorchMajorVersionIsOneLine) {
  nn::CnnNet net;
  auto sgd = make_sgd(net);
  const std::string path = checkpoint_after_one_step("other_libtorch", net, *sgd);
  rewrite_without_checksums(path, [](TensorFile& file) { file.metadata["libtorch_major"] = "0"; });
  const std::string error = load_error(path, net, *sgd);
  EXPECT_NE(error.find("LibTorch 0.x"), std::string::npos) << error;
  EXPECT_EQ(error.find('\n'), std::string::npos) << error;
}

// A run dir continued with another model: one line naming both models and the first tensor that differs, where
// loading listed every tensor of both and blamed `strict`, which the caller had not asked for.
TEST(Checkpoint, ResumingWithAnotherModelIsOneLineNamingBothAndTheFirstDifference) {
  nn::CnnNet net;
  auto sgd = make_sgd(net);
  const std::string path = checkpoint_after_one_step("other_model", net, *sgd);
  nn::CnnNetOptions five_classes;
  five_classes.num_classes = 5;
  nn::CnnNet other(five_classes);
  auto other_sgd = make_sgd(other);
  const torch::Tensor before = other->named_parameters()["conv1.weight"].clone();
  std::string error = load_error(path, other, *other_sgd);
  EXPECT_NE(error.find(path + " was written for another model: 'output.weight' is [10, "), std::string::npos) << error;
  EXPECT_NE(error.find("in the checkpoint, [5, "), std::string::npos) << error;
  EXPECT_NE(error.find("`model` and `num_classes`"), std::string::npos) << error;
  EXPECT_EQ(error.find("strict"), std::string::npos) << error;
  EXPECT_EQ(error.find('\n'), std::string::npos) << error;
  EXPECT_TRUE(torch::equal(other->named_parameters()["conv1.weight"], before)) << "restored before refusing";

  auto sequential = torch::nn::Sequential(torch::nn::Linear(4, 2));
  torch::optim::SGD sequential_sgd(sequential->parameters(), torch::optim::SGDOptions(0.1));
  try {
    load_checkpoint(path, *sequential, sequential_sgd);
    ADD_FAILURE() << "a checkpoint of a CnnNet loaded into a Sequential";
  } catch (const InvalidArgument& refused) {
    error = refused.what();
  }
  EXPECT_NE(error.find("the checkpoint holds a tandem::nn::CnnNetImpl of 12 tensors, this run's model is a "
                       "torch::nn::SequentialImpl of 2, and the model's '0.weight' is not in the checkpoint"),
            std::string::npos)
      << error;

  // Checkpoints of tandems that did not record the model's type still name its size.
  rewrite_without_checksums(path, [](TensorFile& file) { file.metadata.erase("model_class"); });
  error = load_error(path, other, *other_sgd);
  EXPECT_NE(error.find("the checkpoint holds a model of 12 tensors, this run's model is a tandem::nn::CnnNetImpl"),
            std::string::npos)
      << error;
  EXPECT_EQ(load_error(path, net, *sgd), "");
}

// What is wrong with the file itself, where the run dir's checkpoint before it would do: the line says to move it
// out of the way, naming it, or to start elsewhere.
TEST(Checkpoint, AnUnreadableCheckpointSaysToMoveItAside) {
  nn::CnnNet net;
  auto sgd = make_sgd(net);
  const std::string path = checkpoint_after_one_step("unreadable", net, *sgd);
  const std::string remedy = "move checkpoint-0001-00000000.safetensors out of the run dir to continue from the "
                             "checkpoint before it, or start a new run in another `run_dir`";
  rewrite_without_checksums(path, [](TensorFile& file) { file.metadata.erase("step"); });
  std::string error = load_error(path, net, *sgd);
  EXPECT_NE(error.find(path + ": checkpoint metadata lacks 'step'; " + remedy), std::string::npos) << error;

  std::filesystem::resize_file(path, 6);
  error = load_error(path, net, *sgd);
  EXPECT_NE(error.find(path + ": the file is 6 bytes"), std::string::npos) << error;
  EXPECT_NE(error.find(remedy), std::string::npos) << error;
  // What the run dir's search for an intact checkpoint reports and logs: what is wrong, without the remedy,
  // which depends on whether an older checkpoint is left.
  EXPECT_EQ(checkpoint_damage(path).find("move "), std::string::npos) << checkpoint_damage(path);
}

// 2.x's Optimizer::load would bring back the saved options; the continued run's own (its flags) must win.
TEST(Checkpoint, TheContinuedRunKeepsItsOwnOptimizerOptions) {
  nn::CnnNet net;
  auto sgd = make_sgd(net);
  const std::string path = checkpoint_after_one_step("own_options", net, *sgd);
  torch::optim::SGD changed(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.5).weight_decay(0.0));
  load_checkpoint(path, *net, changed);
  const auto& options = static_cast<const torch::optim::SGDOptions&>(changed.param_groups()[0].options());
  EXPECT_DOUBLE_EQ(options.momentum(), 0.5);
  EXPECT_DOUBLE_EQ(options.weight_decay(), 0.0);
}

TEST(Checkpoint, ExtraStateRoundTrips) {
  const std::string dir = make_temp_dir("extra");
  nn::CnnNet net;
  auto sgd = make_sgd(net);
  ExtraState extra;
  extra.tensors["ema.bias"] = torch::arange(5, torch::kFloat32);
  extra.values["best_accuracy"] = "0.9125";
  const std::string path = checkpoint_path(dir, 1, 0);
  save_checkpoint(path, *net, *sgd, sample_state(), extra);
  ExtraState loaded;
  load_checkpoint(path, *net, *sgd, &loaded);
  ASSERT_EQ(loaded.tensors.count("ema.bias"), 1u);
  EXPECT_TRUE(torch::equal(loaded.tensors["ema.bias"], extra.tensors["ema.bias"]));
  EXPECT_EQ(loaded.values["best_accuracy"], "0.9125");
  EXPECT_EQ(loaded.tensors.size(), 1u) << "only the extra.* entries";
}

// Checkpoints of the first format (SGD momentum by parameter name) still continue an SGD run: with momentum
// buffer M restored and gradient G, the next step moves each parameter by -lr * (0.9 * M + G).
TEST(Checkpoint, FirstFormatCheckpointsStillRestoreSgdMomentum) {
  const std::string dir = make_temp_dir("first_format");
  torch::manual_seed(1);
  nn::CnnNet net;
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  for (auto& [name, tensor] : named_state(*net)) tensors.emplace_back("model." + name, tensor.clone());
  std::map<std::string, torch::Tensor> momentum;
  for (const auto& item : net->named_parameters()) {
    momentum[item.key()] = torch::randn(item.value().sizes());
    tensors.emplace_back("optimizer.momentum." + item.key(), momentum[item.key()]);
  }
  const std::string path = checkpoint_path(dir, 1, 0);
  save_safetensors(path, tensors,
                   {{"format", "tandem-checkpoint-1"}, {"epoch", "1"}, {"batches_done", "0"}, {"step", "1"},
                    {"lr", "0.05"}, {"base_lr", "0.05"}, {"lrf", "0.1"}, {"epochs", "10"}, {"sampler_seed", "0"},
                    {"world_size", "1"}});
  torch::optim::SGD sgd(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  load_checkpoint(path, *net, sgd);
  std::map<std::string, torch::Tensor> before;
  for (const auto& item : net->named_parameters()) {
    before[item.key()] = item.value().detach().clone();
    item.value().mutable_grad() = torch::full(item.value().sizes(), 0.5);
  }
  sgd.step();
  for (const auto& item : net->named_parameters()) {
    const torch::Tensor expected = before[item.key()] - 0.05 * (0.9 * momentum[item.key()] + 0.5);
    EXPECT_TRUE(torch::allclose(item.value(), expected, 1e-6, 1e-7)) << item.key();
  }
  torch::optim::Adam adam(net->parameters());
  EXPECT_NE(load_error(path, net, adam).find("SGD state only"), std::string::npos);
}

TEST(Checkpoint, RefusesAFileThatIsNotACheckpoint) {
  const std::string dir = make_temp_dir("refuse");
  nn::CnnNet net;
  auto sgd = make_sgd(net);
  const std::string path = dir + "/weights.safetensors";
  save_checkpoint(path, *net, *sgd, {});
  // A weights-only file (no checkpoint metadata) is refused with the file named.
  std::ofstream(path, std::ios::trunc | std::ios::binary).write("\x02\0\0\0\0\0\0\0{}", 10);
  try {
    load_checkpoint(path, *net, *sgd);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& error) {
    EXPECT_NE(std::string(error.what()).find(path), std::string::npos) << error.what();
  }
}

// Where the bytes of `tensor` lie in the safetensors file at `path`, counted from the file's start.
uint64_t data_offset_of(const std::string& path, const std::string& tensor) {
  std::ifstream in(path, std::ios::binary);
  unsigned char size_bytes[8];
  in.read(reinterpret_cast<char*>(size_bytes), 8);
  uint64_t header_size = 0;
  for (int i = 0; i < 8; ++i) header_size |= static_cast<uint64_t>(size_bytes[i]) << (8 * i);
  std::string header(header_size, '\0');
  in.read(header.data(), static_cast<std::streamsize>(header_size));
  return 8 + header_size + nlohmann::json::parse(header).at(tensor).at("data_offsets").at(0).get<uint64_t>();
}

void flip_byte(const std::string& path, uint64_t offset) {
  std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
  file.seekg(static_cast<std::streamoff>(offset));
  char byte = 0;
  file.read(&byte, 1);
  byte = static_cast<char>(byte ^ 0x10);
  file.seekp(static_cast<std::streamoff>(offset));
  file.write(&byte, 1);
  ASSERT_TRUE(file.good()) << path;
}

// A checkpoint with every kind of entry the loop saves: weights, optimizer archive, RNG rows, extra state.
std::string complete_checkpoint(const std::string& name, nn::CnnNet& net, torch::optim::Optimizer& optimizer) {
  train_step(net, optimizer, 1);
  CheckpointState state = sample_state();
  state.rng = gather_rng_states(nullptr, torch::kCPU);
  ExtraState extra;
  extra.tensors["ema"] = torch::arange(6, torch::kFloat32);
  const std::string path = checkpoint_path(make_temp_dir(name), 1, 0);
  save_checkpoint(path, *net, optimizer, state, extra);
  return path;
}

void expect_one_line_naming(const std::string& error, const std::string& path, const std::string& what) {
  EXPECT_NE(error.find(path), std::string::npos) << error;
  EXPECT_NE(error.find(what), std::string::npos) << error;
  EXPECT_NE(error.find("damaged"), std::string::npos) << error;
  EXPECT_EQ(error.find('\n'), std::string::npos) << error;
}

TEST(CheckpointChecksum, AFlippedByteInAnyTensorIsOneLineNamingTheFileAndTheTensor) {
  for (const std::string tensor : {"model.conv1.weight", "model.output.bias", "rng.cpu", "extra.ema"}) {
    SCOPED_TRACE(tensor);
    torch::manual_seed(1);
    nn::CnnNet net;
    auto sgd = make_sgd(net);
    const std::string path = complete_checkpoint("flipped_" + tensor, net, *sgd);
    flip_byte(path, data_offset_of(path, tensor) + 3);
    expect_one_line_naming(load_error(path, net, *sgd), path, "'" + tensor + "'");
  }
}

TEST(CheckpointChecksum, AChangedMetadataValueIsOneLineNamingTheFile) {
  torch::manual_seed(1);
  nn::CnnNet net;
  auto sgd = make_sgd(net);
  const std::string path = complete_checkpoint("changed_metadata", net, *sgd);
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  const std::string step = "\"step\":\"2\"";
  const size_t at = bytes.find(step);
  ASSERT_NE(at, std::string::npos);
  bytes[at + step.size() - 2] = '7';  // the same length, a valid number: only a checksum notices
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  expect_one_line_naming(load_error(path, net, *sgd), path, "metadata");
}

TEST(CheckpointChecksum, AnIntactCheckpointLoadsAndATruncatedOneIsOneLine) {
  torch::manual_seed(1);
  nn::CnnNet net;
  auto sgd = make_sgd(net);
  const std::string path = complete_checkpoint("truncated", net, *sgd);
  EXPECT_EQ(load_error(path, net, *sgd), "");
  EXPECT_EQ(checkpoint_damage(path), "");
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 100);
  const std::string error = load_error(path, net, *sgd);
  EXPECT_NE(error.find(path), std::string::npos) << error;
  EXPECT_EQ(error.find('\n'), std::string::npos) << error;
  EXPECT_NE(checkpoint_damage(path).find(path), std::string::npos) << checkpoint_damage(path);
}

// Checkpoints of tandem-checkpoint-2 carry no checksums; they still continue a run (a note says they cannot be
// verified), as a run started by an older tandem must not be lost to an upgrade.
TEST(CheckpointChecksum, ACheckpointOfTheFormatBeforeChecksumsStillLoads) {
  torch::manual_seed(1);
  nn::CnnNet net;
  auto sgd = make_sgd(net);
  const std::string path = complete_checkpoint("before_checksums", net, *sgd);
  rewrite_without_checksums(path);
  torch::manual_seed(2);
  nn::CnnNet restored;
  auto restored_sgd = make_sgd(restored);
  EXPECT_EQ(load_error(path, restored, *restored_sgd), "");
  EXPECT_TRUE(torch::equal(restored->named_parameters()["conv1.weight"], net->named_parameters()["conv1.weight"]));
}

// The data a checkpoint's batches_done counts in: a continued run compares it with its own (issue 27, #10).
TEST(Checkpoint, RecordsTheTrainingSetItCameFrom) {
  nn::CnnNet net;
  auto sgd = make_sgd(net);
  CheckpointState state = sample_state();
  state.train_samples = 60000;
  state.train_fingerprint = 0xfedcba9876543210ull;
  const std::string path = checkpoint_path(make_temp_dir("train_set"), 1, 0);
  save_checkpoint(path, *net, *sgd, state);
  const CheckpointState loaded = load_checkpoint(path, *net, *sgd);
  EXPECT_EQ(loaded.train_samples, 60000);
  EXPECT_EQ(loaded.train_fingerprint, 0xfedcba9876543210ull);
}

// A run dir in a shared writable folder: a link planted where the next checkpoint goes must not redirect the
// write (issue 27, #15).
TEST(Checkpoint, ALinkPlantedAsTheNextCheckpointIsRefusedAndItsTargetUntouched) {
  const std::string dir = make_temp_dir("planted_link");
  const std::string outside = make_temp_dir("planted_link_target") + "/precious.txt";
  std::ofstream(outside) << "precious";
  const std::string path = checkpoint_path(dir, 1, 0);
  std::filesystem::create_symlink(outside, path);
  nn::CnnNet net;
  auto sgd = make_sgd(net);
  try {
    save_checkpoint(path, *net, *sgd, sample_state());
    FAIL() << "expected Error";
  } catch (const Error& error) {
    const std::string what = error.what();
    EXPECT_NE(what.find(path), std::string::npos) << what;
    EXPECT_NE(what.find("symbolic link"), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  }
  std::ifstream in(outside);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), "precious");
  EXPECT_TRUE(std::filesystem::is_symlink(path)) << "left as it was";
}

// The temp file a write goes through is created, never opened: a link planted under its name is not followed.
TEST(Checkpoint, ALinkPlantedAsTheTempFileIsNotFollowed) {
  const std::string dir = make_temp_dir("planted_temp_link");
  const std::string outside = make_temp_dir("planted_temp_link_target") + "/precious.txt";
  std::ofstream(outside) << "precious";
  const std::string path = checkpoint_path(dir, 1, 0);
  std::filesystem::create_symlink(outside, path + ".tmp." + std::to_string(::getpid()));
  nn::CnnNet net;
  auto sgd = make_sgd(net);
  try {
    save_checkpoint(path, *net, *sgd, sample_state());
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("symbolic link"), std::string::npos) << error.what();
  }
  std::ifstream in(outside);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), "precious");
}

}  // namespace
}  // namespace tandem::checkpoint
