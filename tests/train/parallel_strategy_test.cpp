// A new way to spread the model is one ParallelStrategy (train/parallel_strategy.h): the strategy below, the
// model itself in one process, is this file's only addition, and train::Loop trains with it, validates its
// options, checkpoints and continues through it, as it does with the strategies LoopOptions::strategy names.
#include <gtest/gtest.h>
#include <torch/optim.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "support/small_loop_runs.h"
#include "support/tiny_datasets.h"
#include "tandem/train/loop.h"
#include "tandem/train/parallel_strategy.h"

namespace tandem::train::parallel_strategy {
namespace {

// What the loop asked of the strategy.
struct Calls {
  int wraps = 0;
  int forwards = 0;
  int checkpoints = 0;
  int restores = 0;
  int unwraps = 0;
};

// Rank 0 writes, and every rank reads, the whole state.
class WholeState : public CheckpointWriter, public CheckpointReader {
 public:
  WholeState(torch::nn::Module& module, torch::optim::Optimizer& optimizer) : module_(module), optimizer_(optimizer) {}
  void write(const std::string& path, const checkpoint::CheckpointState& state,
             const checkpoint::ExtraState& extra) override {
    checkpoint::save_checkpoint(path, module_, optimizer_, state, extra);
  }
  checkpoint::CheckpointState read(const std::string& path, checkpoint::ExtraState* extra) override {
    return checkpoint::load_checkpoint(path, module_, optimizer_, extra);
  }

 private:
  torch::nn::Module& module_;
  torch::optim::Optimizer& optimizer_;
};

// The model itself, trained by one process.
class OneProcess : public ParallelStrategy {
 public:
  explicit OneProcess(Calls& calls) : calls_(calls) {}

  void validate(const LoopOptions& options, int world_size) const override {
    if (world_size > 1) throw InvalidArgument("OneProcess trains in one process");
    if (options.checkpoint_format == CheckpointFormat::kSharded) throw InvalidArgument("OneProcess has no shards");
  }
  void wrap(const ModelToWrap& model) override {
    ++calls_.wraps;
    model_.emplace(model.model);
    optimizer_ = &model.optimizer;
    device_ = model.options.device;
  }
  torch::Tensor forward(const torch::Tensor& input) override {
    ++calls_.forwards;
    return model_->forward(input);
  }
  torch::Tensor evaluation_forward(const torch::Tensor& input) override { return model_->forward(input); }
  std::vector<torch::Device> devices() const override { return {device_}; }
  std::unique_ptr<CheckpointWriter> prepare_checkpoint(const std::string& /*path*/) override {
    ++calls_.checkpoints;
    return std::make_unique<WholeState>(**model_, *optimizer_);
  }
  std::unique_ptr<CheckpointReader> restore_from(const std::string& /*path*/) override {
    ++calls_.restores;
    return std::make_unique<WholeState>(**model_, *optimizer_);
  }
  void unwrap() override { ++calls_.unwraps; }

 private:
  Calls& calls_;
  std::optional<nn::ModelHolder> model_;
  torch::optim::Optimizer* optimizer_ = nullptr;
  torch::Device device_ = torch::kCPU;
};

std::vector<torch::Tensor> weights_of(const torch::nn::Sequential& net) {
  std::vector<torch::Tensor> weights;
  for (const auto& p : net->parameters()) weights.push_back(p.detach().clone());
  return weights;
}

// One rank's run of the small loop, `stop_after` steps (0: all 36), by `strategy` or else options.strategy's.
std::vector<torch::Tensor> fit(const std::string& run_dir, int64_t stop_after, std::unique_ptr<ParallelStrategy> strategy) {
  torch::nn::Sequential net = testing::small_classifier(3);
  torch::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  Loop loop(testing::small_loop_options(Strategy::kDdp, run_dir, stop_after), nullptr);
  auto train_set = testing::separable_set(96, 7), test_set = testing::separable_set(20, 8);
  if (strategy) {
    loop.fit(std::move(strategy), nn::hold_model(net), optimizer, train_set, test_set);
  } else {
    loop.fit(net, optimizer, train_set, test_set);
  }
  return weights_of(net);
}

void expect_equal(const std::vector<torch::Tensor>& expected, const std::vector<torch::Tensor>& actual) {
  ASSERT_EQ(expected.size(), actual.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_TRUE(torch::equal(expected[i], actual[i]))
        << "tensor " << i << " differs by " << (expected[i] - actual[i]).abs().max().item<double>();
  }
}

// One process: DDP's world of one reduces nothing, so the model itself trains to the same weights; a run stopped
// inside an epoch and continued through the strategy's checkpoints ends on them too.
TEST(ParallelStrategy, AStrategyOfOneFileTrainsCheckpointsAndContinuesThroughTheLoop) {
  const auto ddp = fit(testing::make_temp_dir("strategy_ddp"), 0, nullptr);
  Calls whole;
  expect_equal(ddp, fit(testing::make_temp_dir("strategy_whole"), 0, std::make_unique<OneProcess>(whole)));
  EXPECT_EQ(whole.wraps, 1);
  EXPECT_EQ(whole.forwards, 36);  // 3 epochs of 96 / 8 batches
  EXPECT_EQ(whole.checkpoints, 3);  // each epoch's end
  EXPECT_EQ(whole.restores, 0);
  EXPECT_EQ(whole.unwraps, 1);

  const std::string run_dir = testing::make_temp_dir("strategy_continued");
  Calls first, second;
  fit(run_dir, 17, std::make_unique<OneProcess>(first));
  expect_equal(ddp, fit(run_dir, 0, std::make_unique<OneProcess>(second)));
  EXPECT_EQ(second.restores, 1);
  EXPECT_EQ(first.forwards + second.forwards, 36);
}

// The options are the strategy's to refuse, before the run touches the model or the run dir.
TEST(ParallelStrategy, TheLoopAsksTheStrategyGivenWhatItCannotTrainWith) {
  LoopOptions options = testing::small_loop_options(Strategy::kDdp, testing::make_temp_dir("strategy_refuses"));
  options.checkpoint_format = CheckpointFormat::kSharded;
  torch::nn::Sequential net = testing::small_classifier(3);
  torch::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(0.1));
  Calls calls;
  try {
    Loop(options, nullptr)
        .fit(std::make_unique<OneProcess>(calls), nn::hold_model(net), optimizer, testing::separable_set(16, 7), nullptr);
    ADD_FAILURE() << "the strategy's refusal did not stop the run";
  } catch (const InvalidArgument& refusal) {
    EXPECT_STREQ(refusal.what(), "OneProcess has no shards");
  }
  EXPECT_EQ(calls.wraps, 0);
}

// tandem train's --strategy and --checkpoint-format spellings, read by the library beside their enums.
TEST(ParallelStrategy, StrategyAndCheckpointFormatParsersReadTheFlagsSpellingsAndRefuseOthers) {
  EXPECT_EQ(parse_strategy("ddp"), Strategy::kDdp);
  EXPECT_EQ(parse_strategy("dp"), Strategy::kDataParallel);
  EXPECT_EQ(parse_strategy("fsdp"), Strategy::kFsdp);
  for (const char* bad : {"DDP", "hsdp", ""}) EXPECT_THROW(parse_strategy(bad), InvalidArgument) << bad;
  EXPECT_EQ(checkpoint::parse_checkpoint_format("full"), CheckpointFormat::kFull);
  EXPECT_EQ(checkpoint::parse_checkpoint_format("sharded"), CheckpointFormat::kSharded);
  for (const char* bad : {"Full", "pieces", ""}) {
    EXPECT_THROW(checkpoint::parse_checkpoint_format(bad), InvalidArgument) << bad;
  }
}

}  // namespace
}  // namespace tandem::train::parallel_strategy
