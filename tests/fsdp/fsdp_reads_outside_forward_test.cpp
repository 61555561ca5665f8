// Between steps a sharded module's parameters are placeholders and their values are spread over the ranks. A read
// of them on some ranks only (the seeds' `if (is_main_process()) save_weights(...)`) must never gather alone,
// which waits for ranks that are elsewhere: tandem's own readers refuse at once in one line, and an operator that
// reads one is reported at the next call instead of gathering.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>

#include "fsdp_fixtures.h"
#include "support/tiny_datasets.h"
#include "tandem/checkpoint/safetensors.h"
#include "tandem/checkpoint/weights.h"
#include "tandem/train/loop.h"
#include "tandem/util/error.h"

namespace tandem::testing {
namespace {

int64_t gathers_started(const fsdp::ShardedModel& model) {
  int64_t total = 0;
  for (const auto& unit : model.units()) total += unit->gathers_started();
  return total;
}

void train_one_step(fsdp::FullyShardedDataParallel<nn::CnnNet>& model, int rank, int step) {
  torch::optim::SGD optimizer(model.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  Batch batch = rank_batch(FsdpScenario{}, step, 0, rank);
  torch::nn::functional::cross_entropy(model(batch.x), batch.y).backward();
  optimizer.step();
}

TEST(FsdpReadsOutsideForward, SaveWeightsOnRankZeroAloneRefusesAtOnceInOneLine) {
  const std::string path = make_temp_dir("fsdp_rank0_save") + "/weights.safetensors";
  run_thread_ranks(
      2,
      [&](int rank, comm::Communicator& communicator) {
        fsdp::FullyShardedDataParallel<nn::CnnNet> model(make_cnn(3), borrow(communicator));
        train_one_step(model, rank, 0);
        if (rank != 0) return;  // gone, as the seeds' other ranks are by the time rank 0 saves
        try {
          checkpoint::save_weights(*model.module(), path);
          ADD_FAILURE() << "save_weights wrote the placeholders of a sharded module";
        } catch (const InvalidArgument& error) {
          EXPECT_EQ(std::string(error.what()),
                    path + ": cannot save conv1.weight, which fsdp shards over the ranks (this rank holds a "
                           "placeholder); gather the weights with full_parameters() on every rank and save those, "
                           "or write a checkpoint");
        }
        EXPECT_FALSE(std::filesystem::exists(path));
      },
      std::chrono::seconds(10));
}

// An operator reading a parameter on rank 0 alone between steps: nothing is gathered (rank 1 has gone on to the
// next step, whose gathers must pair with rank 0's own), the read is reported in one line, and training goes on.
TEST(FsdpReadsOutsideForward, AnOperatorReadingAParameterOnOneRankGathersNothingAndIsReported) {
  run_thread_ranks(
      2,
      [&](int rank, comm::Communicator& communicator) {
        fsdp::FullyShardedDataParallel<nn::CnnNet> model(make_cnn(3), borrow(communicator));
        train_one_step(model, rank, 0);
        if (rank == 0) {
          const int64_t before = gathers_started(model.sharded());
          const torch::Tensor read = model.module()->named_parameters()["conv2.weight"].sum();
          EXPECT_EQ(gathers_started(model.sharded()), before) << "the read gathered on rank 0 alone";
          try {
            model.sharded().rethrow_failure();
            ADD_FAILURE() << "the read outside forward went unreported";
          } catch (const InvalidArgument& error) {
            EXPECT_EQ(std::string(error.what()),
                      "fsdp: an operator read a parameter of unit conv2 outside the forward and backward, where a "
                      "sharded module holds placeholders (zeros); gather the weights with full_parameters() on every "
                      "rank, or write a checkpoint");
          }
        }
        train_one_step(model, rank, 1);
        for (const auto& [name, value] : model.full_parameters()) {
          EXPECT_TRUE(value.isfinite().all().item<bool>()) << name;
        }
      },
      std::chrono::seconds(30));
}

// train::Loop under fsdp: a callback that read the model stops the run with that line right after it returns.
TEST(FsdpReadsOutsideForward, AnEpochEndCallbackReadingTheModelOnRankZeroStopsTheLoopInOneLine) {
  auto train_set = separable_set(32, 7), test_set = separable_set(16, 8);
  const std::string run_dir = make_temp_dir("fsdp_callback_reads");
  std::vector<std::string> errors(2);
  run_thread_ranks(2, [&](int rank, comm::Communicator& communicator) {
    torch::manual_seed(1);
    torch::nn::Sequential net(torch::nn::Linear(8, 16), torch::nn::Tanh(), torch::nn::Linear(16, 2));
    torch::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(0.1));
    train::LoopOptions options;
    options.epochs = 2;
    options.batch_size = 8;
    options.run_dir = run_dir;
    options.progress = false;
    options.strategy = train::Strategy::kFsdp;
    train::Loop loop(options, comm::CommunicatorPtr(&communicator, [](comm::Communicator*) {}));
    loop.callbacks().on_epoch_end = [&](const train::EpochMetrics&) {
      if (rank == 0) net->parameters().front().sum();  // a user's look at the first weight
    };
    try {
      loop.fit(net, optimizer, train_set, test_set);
    } catch (const Error& error) {
      errors[rank] = error.what();
    }
  });
  EXPECT_NE(errors[0].find("fsdp: an operator read a parameter of unit 0 outside the forward and backward"),
            std::string::npos)
      << errors[0];
  EXPECT_FALSE(errors[1].empty()) << "rank 1 went on alone";
}

}  // namespace
}  // namespace tandem::testing
