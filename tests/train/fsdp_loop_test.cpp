// train::Loop with Strategy::kFsdp on 2 thread ranks, for every optimizer whose state it cuts: the run ends on
// the DDP run's weights, a run stopped inside an epoch and continued from its full-state checkpoint ends on the
// uninterrupted one's bit for bit, and afterwards the optimizer holds the model's parameters again with their
// state, as after a DDP run.
#include <gtest/gtest.h>
#include <torch/optim.h>

#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "support/optimizer_cases.h"
#include "support/small_loop_runs.h"
#include "support/thread_ranks.h"
#include "support/tiny_datasets.h"
#include "tandem/train/loop.h"
#include "tandem/util/compat.h"

namespace tandem::train::fsdp_loop {
namespace {

using testing::OptimizerCase;

struct RankOutcome {
  std::vector<torch::Tensor> weights;
  bool optimizer_holds_the_model = false;  // its one group is the model's parameters, each with state
};

// Three epochs of 6 steps on 2 thread ranks; `stop_after` > 0 stops there (a checkpoint inside an epoch).
std::vector<RankOutcome> fit_on_two_ranks(const OptimizerCase& kind, Strategy strategy, const std::string& run_dir,
                                          uint64_t init_seed, int64_t stop_after) {
  std::vector<torch::nn::Sequential> nets{testing::small_classifier(init_seed), testing::small_classifier(init_seed + 1)};
  auto train_set = testing::separable_set(96, 7), test_set = testing::separable_set(20, 8);
  std::vector<RankOutcome> outcomes(2);
  testing::run_thread_ranks(2, [&](int rank, comm::Communicator& communicator) {
    auto optimizer = kind.make(nets[rank]);
    Loop loop(testing::small_loop_options(strategy, run_dir, stop_after), testing::borrowed(communicator));
    loop.fit(nets[rank], *optimizer, train_set, test_set);
    RankOutcome& outcome = outcomes[rank];
    const auto parameters = nets[rank]->parameters();
    for (const auto& p : parameters) outcome.weights.push_back(p.detach().clone());
    const auto& held = optimizer->param_groups().front().params();
    outcome.optimizer_holds_the_model = held.size() == parameters.size();
    for (size_t i = 0; i < held.size() && outcome.optimizer_holds_the_model; ++i) {
      outcome.optimizer_holds_the_model = held[i].is_same(parameters[i]) &&
                                          optimizer->state().count(compat::optimizer_state_key(held[i])) == 1;
    }
  });
  return outcomes;
}

double relative_difference(const std::vector<torch::Tensor>& expected, const std::vector<torch::Tensor>& actual) {
  double difference = 0, norm = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    difference += (expected[i] - actual[i]).to(torch::kDouble).pow(2).sum().item<double>();
    norm += expected[i].to(torch::kDouble).pow(2).sum().item<double>();
  }
  return std::sqrt(difference / norm);
}

class FsdpLoop : public ::testing::TestWithParam<OptimizerCase> {};

TEST_P(FsdpLoop, EndsOnDdpsWeightsAndContinuesItsCheckpointBitForBit) {
  const std::string name = GetParam().name;
  const auto ddp = fit_on_two_ranks(GetParam(), Strategy::kDdp, testing::make_temp_dir("fsdp_loop_ddp_" + name), 1, 0);
  const auto whole =
      fit_on_two_ranks(GetParam(), Strategy::kFsdp, testing::make_temp_dir("fsdp_loop_whole_" + name), 1, 0);
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_EQ(whole[rank].weights.size(), 4u);
    EXPECT_LE(relative_difference(ddp[rank].weights, whole[rank].weights), 1e-5) << "rank " << rank;
    EXPECT_TRUE(whole[rank].optimizer_holds_the_model) << "rank " << rank;
  }

  // Step 8 is inside epoch 1; the continued run starts from other weights, so all it ends with comes from the
  // checkpoint.
  const std::string split_dir = testing::make_temp_dir("fsdp_loop_split_" + name);
  fit_on_two_ranks(GetParam(), Strategy::kFsdp, split_dir, 1, 8);
  const auto continued = fit_on_two_ranks(GetParam(), Strategy::kFsdp, split_dir, 50, 0);
  for (int rank = 0; rank < 2; ++rank) {
    for (size_t i = 0; i < whole[rank].weights.size(); ++i) {
      EXPECT_TRUE(torch::equal(whole[rank].weights[i], continued[rank].weights[i])) << "rank " << rank << " tensor " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Optimizers, FsdpLoop, ::testing::ValuesIn(testing::stateful_optimizer_cases()),
                         testing::optimizer_case_name);

// Another optimizer kind is one line naming the kinds it takes, before anything is sharded.
TEST(FsdpLoop, OptimizerWhoseStateItCannotCutIsRefused) {
  std::vector<torch::nn::Sequential> nets{testing::small_classifier(1), testing::small_classifier(1)};
  auto train_set = testing::separable_set(32, 7);
  testing::run_thread_ranks(2, [&](int rank, comm::Communicator& communicator) {
    torch::optim::Adagrad optimizer(nets[rank]->parameters(), torch::optim::AdagradOptions(0.1));
    LoopOptions options;
    options.epochs = 1;
    options.batch_size = 8;
    options.run_dir = testing::make_temp_dir("fsdp_loop_adagrad");
    options.progress = false;
    options.strategy = Strategy::kFsdp;
    Loop loop(options, comm::CommunicatorPtr(&communicator, [](comm::Communicator*) {}));
    try {
      loop.fit(nets[rank], optimizer, train_set, nullptr);
      ADD_FAILURE() << "rank " << rank << " trained with Adagrad under fsdp";
    } catch (const InvalidArgument& refusal) {
      EXPECT_NE(std::string(refusal.what()).find("`strategy` fsdp steps torch::optim::SGD, Adam, AdamW or RMSprop"),
                std::string::npos)
          << refusal.what();
    }
  });
}

// LoopOptions::fsdp is the wrapper's own options, but its dtypes are `precision`'s: one setting, in one place.
TEST(FsdpLoop, MixedPrecisionDtypesSetBesidePrecisionAreRefused) {
  torch::nn::Sequential net = testing::small_classifier(1);
  torch::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(0.1));
  LoopOptions options;
  options.run_dir = testing::make_temp_dir("fsdp_loop_dtypes");
  options.progress = false;
  options.strategy = Strategy::kFsdp;
  options.fsdp.mixed_precision.param_dtype = torch::kBFloat16;
  try {
    Loop(options, nullptr).fit(net, optimizer, testing::separable_set(32, 7), nullptr);
    ADD_FAILURE() << "fsdp's param_dtype was set beside `precision`";
  } catch (const InvalidArgument& refusal) {
    EXPECT_STREQ(refusal.what(), "fsdp.mixed_precision's dtypes follow `precision`: leave them float32 and set "
                                 "`precision` bf16-mixed or 16-mixed, which gathers bfloat16 or float16 parameters "
                                 "and reduces in float32");
  }
}

}  // namespace
}  // namespace tandem::train::fsdp_loop
