// A model with a tied weight (one tensor registered in two modules, as an embedding's weight tied to the output
// projection) under train::Loop's fsdp: it trains as DDP trains it; its sharded and full checkpoints continue
// under fsdp bit for bit and under DDP alike; `init_weights` (read_model_weights) loads either strictly, every name
// of the model found, the tie kept.
#include <gtest/gtest.h>
#include <torch/optim.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "support/thread_ranks.h"
#include "support/tiny_datasets.h"
#include "tandem/train/checkpoint.h"
#include "tandem/train/loop.h"
#include "tandem/train/safetensors.h"

namespace tandem::train::fsdp_tied {
namespace {

namespace fs = std::filesystem;

// A linear map by a weight it is given rather than one of its own.
struct ProjectionImpl : torch::nn::Module {
  explicit ProjectionImpl(const torch::Tensor& tied) : weight(register_parameter("weight", tied)) {}
  torch::Tensor forward(const torch::Tensor& x) { return torch::nn::functional::linear(x, weight); }
  torch::Tensor weight;
};
TORCH_MODULE(Projection);

// decode.weight is encode.weight: one tensor, two names in the state dict, read by two of fsdp's default units'
// forwards (encode's unit holds it; decode has no parameter of its own).
struct TiedNetImpl : torch::nn::Module {
  TiedNetImpl()
      : input(register_module("input", torch::nn::Linear(8, 6))),
        encode(register_module("encode", torch::nn::Linear(6, 6))),
        decode(register_module("decode", Projection(encode->weight))),
        output(register_module("output", torch::nn::Linear(6, 2))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    return output(torch::tanh(decode(torch::tanh(encode(torch::tanh(input(x)))))));
  }
  torch::nn::Linear input, encode;
  Projection decode;
  torch::nn::Linear output;
};
TORCH_MODULE(TiedNet);

// The model's parameters, each tensor once, as an optimizer must hold them: LibTorch's parameters() lists the
// tied one twice, and an optimizer over both names would step it twice.
std::vector<torch::Tensor> each_tensor_once(const torch::nn::Module& module) {
  std::vector<torch::Tensor> unique;
  std::set<const void*> seen;
  for (const auto& parameter : module.parameters()) {
    if (seen.insert(parameter.unsafeGetTensorImpl()).second) unique.push_back(parameter);
  }
  return unique;
}

using Weights = std::map<std::string, torch::Tensor>;

Weights weights_of(const torch::nn::Module& module) {
  Weights weights;
  for (const auto& item : module.named_parameters()) weights.emplace(item.key(), item.value().detach().clone());
  return weights;
}

struct Layout {
  int world = 2;
  Strategy strategy = Strategy::kFsdp;
  CheckpointFormat format = CheckpointFormat::kSharded;
};

// Three epochs of 96 samples, batch 8 per rank, Adam (amsgrad: three state tensors and a step); `stop_after` > 0
// stops there. Returns rank 0's final weights.
Weights fit(Layout layout, const std::string& run_dir, uint64_t seed, int64_t stop_after) {
  std::vector<TiedNet> nets;
  for (int rank = 0; rank < layout.world; ++rank) {
    torch::manual_seed(seed + rank);
    nets.emplace_back();
  }
  auto train_set = testing::separable_set(96, 7), test_set = testing::separable_set(20, 8);
  testing::run_thread_ranks(layout.world, [&](int rank, comm::Communicator& communicator) {
    torch::optim::Adam optimizer(each_tensor_once(*nets[rank]), torch::optim::AdamOptions(1e-2).amsgrad(true));
    LoopOptions options;
    options.epochs = 3;
    options.batch_size = 8;
    options.run_dir = run_dir;
    options.progress = false;
    options.max_steps = stop_after;
    options.strategy = layout.strategy;
    options.checkpoint_format = layout.format;
    Loop loop(options, comm::CommunicatorPtr(&communicator, [](comm::Communicator*) {}));
    loop.fit(nets[rank], optimizer, train_set, test_set);
    EXPECT_TRUE(nets[rank]->decode->weight.is_same(nets[rank]->encode->weight)) << "rank " << rank << " untied";
  });
  return weights_of(*nets[0]);
}

// A run dir holding a copy of every file of `from`'s checkpoint `stem`.
std::string copy_of(const std::string& from, const std::string& stem, const std::string& name) {
  const std::string to = testing::make_temp_dir(name);
  for (const auto& entry : fs::directory_iterator(from)) {
    const std::string file = entry.path().filename().string();
    if (file.rfind(stem + ".", 0) == 0) fs::copy_file(entry.path(), to + "/" + file);
  }
  return to;
}

void expect_equal(const Weights& expected, const Weights& actual, const std::string& what) {
  ASSERT_EQ(expected.size(), actual.size()) << what;
  for (const auto& [name, tensor] : expected) {
    auto found = actual.find(name);
    ASSERT_NE(found, actual.end()) << what << ": no " << name;
    EXPECT_TRUE(torch::equal(tensor, found->second))
        << what << ": " << name << " differs by " << (tensor - found->second).abs().max().item<double>();
  }
}

double relative_l2(const Weights& expected, const Weights& actual) {
  double difference = 0, norm = 0;
  for (const auto& [name, tensor] : expected) {
    difference += (tensor - actual.at(name)).to(torch::kDouble).pow(2).sum().item<double>();
    norm += tensor.to(torch::kDouble).pow(2).sum().item<double>();
  }
  return std::sqrt(difference / norm);
}

// The weights `init_weights` gives a fresh model from the checkpoint at `path`, loaded strictly.
Weights initialised_from(const std::string& path) {
  TiedNet net;
  const LoadReport report = load_weights(*net, read_model_weights(path), path, /*strict=*/true);
  EXPECT_EQ(report.loaded.size(), 7u) << path << ": every name of the model, decode.weight too";
  EXPECT_TRUE(net->decode->weight.is_same(net->encode->weight));
  return weights_of(*net);
}

TEST(FsdpTiedParameters, TrainAsDdpAndTheirCheckpointsContinueUnderFsdpAndDdpAndLoadByInit) {
  const Layout sharded, full{2, Strategy::kFsdp, CheckpointFormat::kFull};
  const Layout ddp{2, Strategy::kDdp, CheckpointFormat::kFull};
  const Weights whole = fit(sharded, testing::make_temp_dir("fsdp_tied_whole"), 1, 0);
  ASSERT_EQ(whole.size(), 7u);
  const double from_ddp = relative_l2(fit(ddp, testing::make_temp_dir("fsdp_tied_ddp"), 1, 0), whole);
  std::printf("[fsdp tied] relative L2 from DDP's run: %.3g\n", from_ddp);
  EXPECT_LE(from_ddp, 1e-5);

  // Step 8 is batch 2 of epoch 1. The continued runs start from other weights: all they end with comes from the
  // checkpoint.
  const std::string stopped = testing::make_temp_dir("fsdp_tied_stopped");
  const std::string stopped_full = testing::make_temp_dir("fsdp_tied_stopped_full");
  fit(sharded, stopped, 1, 8);
  fit(full, stopped_full, 1, 8);
  const std::string stem = "checkpoint-0001-00000002";
  ASSERT_TRUE(fs::exists(stopped + "/" + stem + ".index.json"));
  const std::string checkpoint = stopped + "/" + stem + ".safetensors";
  const std::string checkpoint_full = stopped_full + "/" + stem + ".safetensors";
  const Weights init_sharded = initialised_from(checkpoint);
  expect_equal(init_sharded, initialised_from(checkpoint_full), "init from the sharded and the full checkpoint");
  EXPECT_TRUE(torch::equal(init_sharded.at("decode.weight"), init_sharded.at("encode.weight")));

  const std::string ddp_sharded = copy_of(stopped, stem, "fsdp_tied_ddp_sharded");
  const std::string ddp_full = copy_of(stopped_full, stem, "fsdp_tied_ddp_full");
  expect_equal(whole, fit(sharded, stopped, 50, 0), "fsdp continuing its sharded checkpoint");
  expect_equal(whole, fit(full, stopped_full, 50, 0), "fsdp continuing its full checkpoint");
  expect_equal(fit(ddp, ddp_full, 50, 0), fit(ddp, ddp_sharded, 60, 0), "ddp continuing the sharded checkpoint");
}

// An optimizer over LibTorch's parameters(), which lists the tied tensor under both names, would step it twice a
// step and write an archive that loads back a null state for it: refused before training, naming both names.
TEST(FsdpTiedParameters, AnOptimizerHoldingTheTiedTensorTwiceIsRefused) {
  for (Strategy strategy : {Strategy::kDdp, Strategy::kFsdp}) {
    TiedNet net;
    const Weights before = weights_of(*net);
    torch::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(0.1));
    LoopOptions options;
    options.run_dir = testing::make_temp_dir("fsdp_tied_twice");
    options.progress = false;
    options.strategy = strategy;
    try {
      Loop(options, nullptr).fit(net, optimizer, testing::separable_set(32, 7), nullptr);
      ADD_FAILURE() << "an optimizer holding encode.weight twice trained";
    } catch (const InvalidArgument& refusal) {
      EXPECT_STREQ(refusal.what(), "the optimizer holds the model's 'encode.weight' twice (it is 'decode.weight' "
                                   "too): build the optimizer over each tensor once (Module::parameters() lists a "
                                   "tensor registered in two modules, a tied weight, under each of its names)");
    }
    expect_equal(before, weights_of(*net), "weights after a refused fit");
  }
}

}  // namespace
}  // namespace tandem::train::fsdp_tied
