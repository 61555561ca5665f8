// train::Loop's sharded checkpoints (LoopOptions::checkpoint_format kSharded) for every optimizer fsdp cuts: a run
// stopped inside an epoch continues from its pieces bit for bit on the same world size; on one rank, and under
// DDP (which gathers the pieces whole), it continues exactly as it does from the full-state checkpoint of the same
// step, so every state field and scalar (Adam's step, RMSprop's averages) came back. The index records the units
// that LoopOptions::fsdp's policy cut.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/optim.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "support/optimizer_cases.h"
#include "support/thread_ranks.h"
#include "support/tiny_datasets.h"
#include "tandem/train/loop.h"

namespace tandem::train::fsdp_sharded_loop {
namespace {

namespace fs = std::filesystem;
using testing::OptimizerCase;

struct Layout {
  int world = 2;
  Strategy strategy = Strategy::kFsdp;
  CheckpointFormat format = CheckpointFormat::kSharded;
};

// Three epochs of 96 samples, batch 8 per rank; `stop_after` > 0 stops there. Returns rank 0's final weights.
std::vector<torch::Tensor> fit(const OptimizerCase& kind, Layout layout, const std::string& run_dir, uint64_t seed,
                               int64_t stop_after) {
  std::vector<torch::nn::Sequential> nets;
  for (int rank = 0; rank < layout.world; ++rank) {
    torch::manual_seed(seed + rank);
    nets.push_back(torch::nn::Sequential(torch::nn::Linear(8, 16), torch::nn::Tanh(), torch::nn::Linear(16, 2)));
  }
  auto train_set = testing::separable_set(96, 7), test_set = testing::separable_set(20, 8);
  testing::run_thread_ranks(layout.world, [&](int rank, comm::Communicator& communicator) {
    auto optimizer = kind.make(nets[rank]);
    LoopOptions options;
    options.epochs = 3;
    options.batch_size = 8;
    options.run_dir = run_dir;
    options.progress = false;
    options.max_steps = stop_after;
    options.strategy = layout.strategy;
    options.checkpoint_format = layout.format;
    Loop loop(options, comm::CommunicatorPtr(&communicator, [](comm::Communicator*) {}));
    loop.fit(nets[rank], *optimizer, train_set, test_set);
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
  const Layout sharded, full{2, Strategy::kFsdp, CheckpointFormat::kFull};
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
  const Layout one{1, Strategy::kFsdp, CheckpointFormat::kSharded};
  expect_equal(fit(kind, one, one_full, 50, 0), fit(kind, one, one_sharded, 60, 0), "1 rank");
  const Layout ddp{2, Strategy::kDdp, CheckpointFormat::kFull};
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
    LoopOptions options;
    options.epochs = 1;
    options.batch_size = 8;
    options.max_steps = 1;
    options.run_dir = run_dir;
    options.progress = false;
    options.strategy = Strategy::kFsdp;
    options.checkpoint_format = CheckpointFormat::kSharded;
    options.fsdp.units = units;
    Loop(options, comm::CommunicatorPtr(&communicator, [](comm::Communicator*) {}))
        .fit(nets[rank], optimizer, train_set, nullptr);
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

INSTANTIATE_TEST_SUITE_P(Optimizers, FsdpShardedLoop, ::testing::ValuesIn(testing::stateful_optimizer_cases()),
                         testing::optimizer_case_name);

}  // namespace
}  // namespace tandem::train::fsdp_sharded_loop
