// train::Loop's sharded checkpoints (LoopOptions::checkpoint_format kSharded) for every optimizer fsdp cuts: a run
// stopped inside an epoch continues from its pieces bit for bit on the same world size; on one rank, and under
// DDP (which gathers the pieces whole), it continues exactly as it does from the full-state checkpoint of the same
// step, so every state field and scalar (Adam's step, RMSprop's averages) came back. The index records the units
// that LoopOptions::fsdp's policy cut. A tied weight (one tensor under two names) survives both kinds of checkpoint.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/optim.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "support/optimizer_cases.h"
#include "support/small_loop_runs.h"
#include "support/thread_ranks.h"
#include "support/tiny_datasets.h"
#include "tandem/checkpoint/safetensors.h"
#include "tandem/checkpoint/weights.h"
#include "tandem/train/loop.h"

namespace tandem::train::fsdp_sharded_loop {
namespace {

namespace fs = std::filesystem;
using testing::OptimizerCase;

struct Layout {
  int world = 2;
  Strategy strategy = Strategy::kFsdp;
  checkpoint::CheckpointFormat format = checkpoint::CheckpointFormat::kSharded;
};

// The shared small run (support/small_loop_runs.h) in `layout`'s format; `stop_after` > 0 stops there.
LoopOptions options_of(const Layout& layout, const std::string& run_dir, int64_t stop_after) {
  LoopOptions options = testing::small_loop_options(layout.strategy, run_dir, stop_after);
  options.checkpoint_format = layout.format;
  return options;
}

// 96 samples; `stop_after` > 0 stops there. Returns rank 0's final weights.
std::vector<torch::Tensor> fit(const OptimizerCase& kind, Layout layout, const std::string& run_dir, uint64_t seed,
                               int64_t stop_after) {
  std::vector<torch::nn::Sequential> nets;
  for (int rank = 0; rank < layout.world; ++rank) nets.push_back(testing::small_classifier(seed + rank));
  auto train_set = testing::separable_set(96, 7), test_set = testing::separable_set(20, 8);
  testing::run_thread_ranks(layout.world, [&](int rank, comm::Communicator& communicator) {
    auto optimizer = kind.make(nets[rank]);
    Loop(options_of(layout, run_dir, stop_after), testing::borrowed(communicator)).fit(nets[rank], *optimizer, train_set, test_set);
  });
  std::vector<torch::Tensor> weights;
  for (const auto& p : nets[0]->parameters()) weights.push_back(p.detach().clone());
  return weights;
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

void expect_equal(const std::vector<torch::Tensor>& expected, const std::vector<torch::Tensor>& actual,
                  const std::string& what) {
  ASSERT_EQ(expected.size(), actual.size()) << what;
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_TRUE(torch::equal(expected[i], actual[i]))
        << what << ": tensor " << i << " differs by " << (expected[i] - actual[i]).abs().max().item<double>();
  }
}

class FsdpShardedLoop : public ::testing::TestWithParam<OptimizerCase> {};

TEST_P(FsdpShardedLoop, ContinuesItsPiecesAsTheFullStateOnAnyLayout) {
  const OptimizerCase& kind = GetParam();
  const std::string name = kind.name;
  const Layout sharded, full{2, Strategy::kFsdp, checkpoint::CheckpointFormat::kFull};
  const auto whole = fit(kind, full, testing::make_temp_dir("fsdp_sharded_whole_" + name), 1, 0);

  // Step 8 is batch 2 of epoch 1. The continued runs start from other weights: all they end with comes from the
  // checkpoint.
  const std::string stopped = testing::make_temp_dir("fsdp_sharded_stopped_" + name);
  const std::string stopped_full = testing::make_temp_dir("fsdp_sharded_stopped_full_" + name);
  fit(kind, sharded, stopped, 1, 8);
  fit(kind, full, stopped_full, 1, 8);
  const std::string stem = "checkpoint-0001-00000002";
  ASSERT_TRUE(fs::exists(stopped + "/" + stem + ".index.json"));
  const std::string one_sharded = copy_of(stopped, stem, "fsdp_sharded_one_" + name);
  const std::string one_full = copy_of(stopped_full, stem, "fsdp_sharded_one_full_" + name);
  const std::string ddp_sharded = copy_of(stopped, stem, "fsdp_sharded_ddp_" + name);
  const std::string ddp_full = copy_of(stopped_full, stem, "fsdp_sharded_ddp_full_" + name);

  expect_equal(whole, fit(kind, sharded, stopped, 50, 0), "2 ranks continuing their pieces");
  const Layout one{1, Strategy::kFsdp, checkpoint::CheckpointFormat::kSharded};
  expect_equal(fit(kind, one, one_full, 50, 0), fit(kind, one, one_sharded, 60, 0), "1 rank");
  const Layout ddp{2, Strategy::kDdp, checkpoint::CheckpointFormat::kFull};
  expect_equal(fit(kind, ddp, ddp_full, 50, 0), fit(kind, ddp, ddp_sharded, 60, 0), "ddp");
}

// The units the loop cut, as the index of its one-step sharded checkpoint records them, under `units`.
std::vector<std::string> units_cut(const fsdp::UnitPolicy& units, const std::string& name) {
  std::vector<torch::nn::Sequential> nets;
  for (int rank = 0; rank < 2; ++rank) {
    nets.push_back(torch::nn::Sequential(torch::nn::Linear(8, 16), torch::nn::Tanh(), torch::nn::Linear(16, 2)));
  }
  const std::string run_dir = testing::make_temp_dir(name);
  auto train_set = testing::separable_set(32, 7);
  testing::run_thread_ranks(2, [&](int rank, comm::Communicator& communicator) {
    torch::optim::SGD optimizer(nets[rank]->parameters(), torch::optim::SGDOptions(0.1));
    LoopOptions options = options_of(Layout{}, run_dir, 1);
    options.fsdp.units = units;
    Loop(options, testing::borrowed(communicator)).fit(nets[rank], optimizer, train_set, nullptr);
  });
  std::ifstream index(run_dir + "/checkpoint-0000-00000001.index.json");
  EXPECT_TRUE(index.good()) << "no index in " << run_dir;
  const nlohmann::json parsed = nlohmann::json::parse(index);
  std::vector<std::string> names;
  for (const auto& unit : parsed.at("units")) names.push_back(unit.at("name").get<std::string>());
  return names;
}

TEST(FsdpShardedLoopUnits, TheLoopCutsTheUnitsItsPolicyNames) {
  EXPECT_EQ(units_cut({}, "fsdp_units_default"), (std::vector<std::string>{"0", "2"})) << "each child a unit";
  fsdp::UnitPolicy by_size;
  by_size.min_parameters = 1000;  // more than the model holds: all in the root unit
  EXPECT_EQ(units_cut(by_size, "fsdp_units_by_size"), (std::vector<std::string>{""}));
}

// A linear map by a weight it is given rather than one of its own.
struct ProjectionImpl : torch::nn::Module {
  explicit ProjectionImpl(const torch::Tensor& tied) : weight(register_parameter("weight", tied)) {}
  torch::Tensor forward(const torch::Tensor& x) { return torch::nn::functional::linear(x, weight); }
  torch::Tensor weight;
};
TORCH_MODULE(Projection);

// A tied weight, as an embedding's tied to the output projection: decode.weight is encode.weight, one tensor under
// two names in the state dict, read by the forwards of two of fsdp's default units (encode's holds it; decode has
// no parameter of its own).
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

// By named_parameters(): input.weight, input.bias, encode.weight, encode.bias, decode.weight, output.*.
constexpr size_t kTiedNames = 7, kEncodeWeight = 2, kDecodeWeight = 4;

std::vector<torch::Tensor> named_weights(const torch::nn::Module& module) {
  std::vector<torch::Tensor> weights;
  for (const auto& item : module.named_parameters()) weights.push_back(item.value().detach().clone());
  return weights;
}

// The model's parameters, each tensor once, as an optimizer must hold them: LibTorch's parameters() lists the tied
// one twice.
std::vector<torch::Tensor> each_tensor_once(const torch::nn::Module& module) {
  std::vector<torch::Tensor> unique;
  std::set<const void*> seen;
  for (const auto& parameter : module.parameters()) {
    if (seen.insert(parameter.unsafeGetTensorImpl()).second) unique.push_back(parameter);
  }
  return unique;
}

// The TiedNet with Adam (amsgrad: three state tensors and a step) on 96 samples; rank 0's weights by name order.
std::vector<torch::Tensor> fit_tied(Layout layout, const std::string& run_dir, uint64_t seed, int64_t stop_after) {
  std::vector<TiedNet> nets;
  for (int rank = 0; rank < layout.world; ++rank) {
    torch::manual_seed(seed + rank);
    nets.emplace_back();
  }
  auto train_set = testing::separable_set(96, 7), test_set = testing::separable_set(20, 8);
  testing::run_thread_ranks(layout.world, [&](int rank, comm::Communicator& communicator) {
    torch::optim::Adam optimizer(each_tensor_once(*nets[rank]), torch::optim::AdamOptions(1e-2).amsgrad(true));
    Loop(options_of(layout, run_dir, stop_after), testing::borrowed(communicator)).fit(nets[rank], optimizer, train_set, test_set);
    EXPECT_TRUE(nets[rank]->decode->weight.is_same(nets[rank]->encode->weight)) << "rank " << rank << " untied";
  });
  return named_weights(*nets[0]);
}

// What `init_weights` gives a fresh TiedNet from the checkpoint at `path`, loaded strictly.
std::vector<torch::Tensor> initialised_from(const std::string& path) {
  TiedNet net;
  const checkpoint::LoadReport report =
      checkpoint::load_weights(*net, checkpoint::read_model_weights(path), path, /*strict=*/true);
  EXPECT_EQ(report.loaded.size(), kTiedNames) << path << ": every name of the model, decode.weight too";
  EXPECT_TRUE(net->decode->weight.is_same(net->encode->weight));
  return named_weights(*net);
}

// The tied model trains as DDP trains it; its sharded and full checkpoints continue under fsdp bit for bit and
// under DDP alike, and `init_weights` loads either strictly. Before, the sharded checkpoint held the tensor under
// encode.weight only (a resume and --init --strict refused decode.weight), and the full one's optimizer archive
// held it twice and loaded back a null state for it.
TEST(FsdpShardedLoopTied, TrainsAsDdpAndItsCheckpointsContinueUnderFsdpAndDdpAndLoadByInit) {
  const Layout sharded, full{2, Strategy::kFsdp, checkpoint::CheckpointFormat::kFull};
  const Layout ddp{2, Strategy::kDdp, checkpoint::CheckpointFormat::kFull};
  const auto whole = fit_tied(sharded, testing::make_temp_dir("fsdp_tied_whole"), 1, 0);
  ASSERT_EQ(whole.size(), kTiedNames);
  expect_equal(whole, fit_tied(ddp, testing::make_temp_dir("fsdp_tied_ddp"), 1, 0), "fsdp against ddp");

  const std::string stopped = testing::make_temp_dir("fsdp_tied_stopped");
  const std::string stopped_full = testing::make_temp_dir("fsdp_tied_stopped_full");
  fit_tied(sharded, stopped, 1, 8);
  fit_tied(full, stopped_full, 1, 8);
  const std::string stem = "checkpoint-0001-00000002";
  ASSERT_TRUE(fs::exists(stopped + "/" + stem + ".index.json"));
  const auto init_sharded = initialised_from(stopped + "/" + stem + ".safetensors");
  expect_equal(init_sharded, initialised_from(stopped_full + "/" + stem + ".safetensors"), "init, sharded and full");
  EXPECT_TRUE(torch::equal(init_sharded[kDecodeWeight], init_sharded[kEncodeWeight]));

  const std::string ddp_sharded = copy_of(stopped, stem, "fsdp_tied_ddp_sharded");
  const std::string ddp_full = copy_of(stopped_full, stem, "fsdp_tied_ddp_full");
  expect_equal(whole, fit_tied(sharded, stopped, 50, 0), "fsdp continuing its sharded checkpoint");
  expect_equal(whole, fit_tied(full, stopped_full, 50, 0), "fsdp continuing its full checkpoint");
  expect_equal(fit_tied(ddp, ddp_full, 50, 0), fit_tied(ddp, ddp_sharded, 60, 0), "ddp continuing the sharded one");
}

// An optimizer over LibTorch's parameters(), which lists the tied tensor under both names, would step it twice a
// step and write an archive that loads back a null state for it: refused before training, naming both names.
TEST(FsdpShardedLoopTied, AnOptimizerHoldingTheTiedTensorTwiceIsRefused) {
  for (Strategy strategy : {Strategy::kDdp, Strategy::kFsdp}) {
    TiedNet net;
    const auto before = named_weights(*net);
    torch::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(0.1));
    try {
      const Layout layout{1, strategy, checkpoint::CheckpointFormat::kFull};
      Loop(options_of(layout, testing::make_temp_dir("fsdp_tied_twice"), 0), nullptr)
          .fit(net, optimizer, testing::separable_set(32, 7), nullptr);
      ADD_FAILURE() << "an optimizer holding encode.weight twice trained";
    } catch (const InvalidArgument& refusal) {
      EXPECT_STREQ(refusal.what(), "the optimizer holds the model's 'encode.weight' twice (it is 'decode.weight' "
                                   "too): build the optimizer over each tensor once (Module::parameters() lists a "
                                   "tensor registered in two modules, a tied weight, under each of its names)");
    }
    expect_equal(before, named_weights(*net), "weights after a refused fit");
  }
}

INSTANTIATE_TEST_SUITE_P(Optimizers, FsdpShardedLoop, ::testing::ValuesIn(testing::stateful_optimizer_cases()),
                         testing::optimizer_case_name);

}  // namespace
}  // namespace tandem::train::fsdp_sharded_loop
