// ZeroRedundancyOptimizer with ranks as threads: it steps like the plain optimizer on the same gradients, its
// consolidated state is the plain optimizer's, a plain optimizer's archive loads into it, and each rank holds about
// 1/world of the state. The parity with DDP in real processes is zero_process_test.cpp.
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <mutex>
#include <stdexcept>
#include <string>

#include "support/thread_ranks.h"
#include "tandem/optim/optimizer_archive.h"
#include "tandem/optim/state_bytes.h"
#include "tandem/optim/zero_redundancy_optimizer.h"
#include "tandem/util/error.h"

namespace tandem::optim {
namespace {

using torch::optim::Optimizer;

comm::CommunicatorPtr borrow(comm::Communicator& communicator) {
  return comm::CommunicatorPtr(&communicator, [](comm::Communicator*) {});
}

torch::Generator generator(uint64_t seed) { return at::make_generator<at::CPUGeneratorImpl>(seed); }

// Shapes of uneven sizes, so that a partition over 3 ranks is uneven too.
std::vector<torch::Tensor> make_parameters() {
  const std::vector<std::vector<int64_t>> shapes = {{16, 8}, {16}, {4, 16}, {4}, {32, 4}, {3, 3}, {7}};
  std::vector<torch::Tensor> parameters;
  auto gen = generator(5);
  for (const auto& shape : shapes) parameters.push_back(torch::randn(shape, gen).requires_grad_());
  return parameters;
}

// The same gradients on every rank, as DDP leaves them.
void set_gradients(std::vector<torch::Tensor>& parameters, int step) {
  auto gen = generator(100 + step);
  for (auto& parameter : parameters) parameter.mutable_grad() = torch::randn(parameter.sizes(), gen);
}

const auto kSgd = torch::optim::SGDOptions(0.1).momentum(0.9).weight_decay(1e-2);
const auto kAdam = torch::optim::AdamOptions(1e-2).weight_decay(1e-3);

double largest_difference(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  double largest = 0;
  for (size_t i = 0; i < a.size(); ++i) largest = std::max(largest, (a[i] - b[i]).abs().max().item<double>());
  return largest;
}

// Steps `sharded` and `plain` (over a copy of the parameters) on the same gradients, with a learning rate that
// changes as a schedule's would; returns the largest difference of the parameters over all steps.
double step_both(Optimizer& sharded, std::vector<torch::Tensor>& parameters, Optimizer& plain,
                 std::vector<torch::Tensor>& reference, int first_step, int steps) {
  double largest = 0;
  for (int step = first_step; step < first_step + steps; ++step) {
    for (Optimizer* optimizer : {&sharded, &plain}) optimizer->param_groups()[0].options().set_lr(0.01 * (1 + step % 3));
    set_gradients(parameters, step);
    set_gradients(reference, step);
    sharded.step();
    plain.step();
    largest = std::max(largest, largest_difference(parameters, reference));
  }
  return largest;
}

std::vector<torch::Tensor> copy_of(const std::vector<torch::Tensor>& parameters) {
  std::vector<torch::Tensor> copies;
  for (const auto& parameter : parameters) copies.push_back(parameter.detach().clone().requires_grad_());
  return copies;
}

template <typename OptimizerType, typename Options>
void expect_plain_trajectory(int world, const Options& options, const char* name) {
  std::mutex print;
  testing::run_thread_ranks(world, [&](int rank, comm::Communicator& communicator) {
    std::vector<torch::Tensor> parameters = make_parameters(), reference = copy_of(parameters);
    ZeroRedundancyOptimizer sharded(parameters, make_optimizer<OptimizerType>(options), borrow(communicator));
    OptimizerType plain(reference, options);
    const double largest = step_both(sharded, parameters, plain, reference, 0, 6);
    std::lock_guard<std::mutex> lock(print);
    std::printf("[zero parity] %s, %d ranks, rank %d: largest difference %.3g\n", name, world, rank, largest);
    EXPECT_EQ(largest, 0.0) << "the owner runs the plain optimizer's arithmetic and the others copy its result";
  });
}

TEST(ZeroRedundancyOptimizer, StepsSgdWithMomentumLikeThePlainOptimizer) {
  expect_plain_trajectory<torch::optim::SGD>(3, kSgd, "SGD momentum");
}

TEST(ZeroRedundancyOptimizer, StepsAdamLikeThePlainOptimizer) {
  expect_plain_trajectory<torch::optim::Adam>(2, kAdam, "Adam");
}

TEST(ZeroRedundancyOptimizer, AWorldOfOneOwnsAllTheStateAndSavesWithoutACommunicator) {
  std::vector<torch::Tensor> parameters = make_parameters(), reference = copy_of(parameters);
  ZeroRedundancyOptimizer sharded(parameters, make_optimizer<torch::optim::Adam>(kAdam), nullptr);
  torch::optim::Adam plain(reference, kAdam);
  EXPECT_EQ(step_both(sharded, parameters, plain, reference, 0, 3), 0.0);
  EXPECT_EQ(sharded.local_optimizer().state().size(), parameters.size());
  EXPECT_EQ(optimizer_state_bytes(sharded.local_optimizer()), optimizer_state_bytes(plain));
  sharded.consolidate_state_dict();
  EXPECT_NO_THROW(save_optimizer_archive(sharded));
}

TEST(ZeroRedundancyOptimizer, CountsStateBytesOfAnyOptimizerAsItsTensors) {
  std::vector<torch::Tensor> parameters = make_parameters();
  auto options = kAdam;
  torch::optim::Adam adam(parameters, options.amsgrad(true));
  set_gradients(parameters, 0);
  adam.step();
  int64_t parameter_bytes = 0;
  for (const auto& parameter : parameters) parameter_bytes += parameter.numel() * parameter.element_size();
  // exp_avg, exp_avg_sq and max_exp_avg_sq per parameter; the step count is a number, and would add a few bytes
  // were it a tensor.
  const int64_t bytes = optimizer_state_bytes(adam);
  EXPECT_GE(bytes, 3 * parameter_bytes);
  EXPECT_LE(bytes, 3 * parameter_bytes + static_cast<int64_t>(parameters.size()) * 8);
}

// After some steps, `root` consolidates; a plain optimizer loaded from the archive the root saves continues on the
// trajectory of the plain optimizer that ran all along. Saving elsewhere, or after a later step, is refused.
template <typename OptimizerType, typename Options>
void expect_consolidated_archive_continues_plainly(int world, int root, const Options& options) {
  testing::run_thread_ranks(world, [&](int rank, comm::Communicator& communicator) {
    std::vector<torch::Tensor> parameters = make_parameters(), reference = copy_of(parameters);
    ZeroRedundancyOptimizer sharded(parameters, make_optimizer<OptimizerType>(options), borrow(communicator));
    OptimizerType plain(reference, options);
    step_both(sharded, parameters, plain, reference, 0, 4);
    sharded.consolidate_state_dict(root);
    torch::Tensor archive;
    if (rank == root) {
      archive = save_optimizer_archive(sharded);
    } else {
      EXPECT_THROW(save_optimizer_archive(sharded), InvalidArgument);
    }
    std::vector<torch::Tensor> resumed_parameters = copy_of(parameters);
    step_both(sharded, parameters, plain, reference, 4, 1);
    if (rank != root) return;
    EXPECT_THROW(save_optimizer_archive(sharded), InvalidArgument) << "the consolidated state is a step old";

    OptimizerType resumed(resumed_parameters, options);
    load_optimizer_archive(resumed, archive, torch::kCPU);
    resumed.param_groups()[0].options().set_lr(plain.param_groups()[0].options().get_lr());
    set_gradients(resumed_parameters, 4);
    resumed.step();
    EXPECT_EQ(largest_difference(resumed_parameters, reference), 0.0);
  });
}

TEST(ZeroRedundancyOptimizer, ConsolidatedSgdStateIsThePlainOptimizers) {
  expect_consolidated_archive_continues_plainly<torch::optim::SGD>(3, 1, kSgd);
}

TEST(ZeroRedundancyOptimizer, ConsolidatedAdamStateIsThePlainOptimizers) {
  expect_consolidated_archive_continues_plainly<torch::optim::Adam>(2, 0, kAdam);
}

// The root cannot load the first other rank's share (its factory throws): every rank fails, the root with its
// own error and the others naming the root, rather than some leaving consolidate_state_dict as if it had
// worked and others waiting in a broadcast the root never joins.
void expect_every_rank_fails_with_the_root(int world) {
  std::vector<std::string> errors(static_cast<size_t>(world));
  testing::run_thread_ranks(
      world,
      [&](int rank, comm::Communicator& communicator) {
        int made = 0;  // the local optimizer, the root's full one, then one per other rank's share
        OptimizerFactory fails_on_first_share = [&made, rank](std::vector<torch::optim::OptimizerParamGroup> groups)
            -> std::unique_ptr<Optimizer> {
          if (rank == 0 && ++made == 3) throw std::runtime_error("injected: this share cannot be loaded");
          return std::make_unique<torch::optim::SGD>(std::move(groups), kSgd);
        };
        std::vector<torch::Tensor> parameters = make_parameters();
        ZeroRedundancyOptimizer sharded(parameters, fails_on_first_share, borrow(communicator));
        set_gradients(parameters, 0);
        sharded.step();
        try {
          sharded.consolidate_state_dict(0);
        } catch (const std::exception& error) {
          errors[static_cast<size_t>(rank)] = error.what();
        }
      },
      std::chrono::seconds(10));
  EXPECT_NE(errors[0].find("could not gather rank 1's optimizer state: injected: this share cannot be loaded"),
            std::string::npos)
      << errors[0];
  for (int rank = 1; rank < world; ++rank) {
    EXPECT_NE(errors[static_cast<size_t>(rank)].find("rank 0 failed to consolidate the optimizer state"),
              std::string::npos)
        << "rank " << rank << ": " << errors[static_cast<size_t>(rank)];
  }
}

TEST(ZeroRedundancyOptimizer, ARootThatCannotLoadAShareFailsEveryRankOfTwo) { expect_every_rank_fails_with_the_root(2); }

TEST(ZeroRedundancyOptimizer, ARootThatCannotLoadAShareFailsEveryRankOfThree) {
  expect_every_rank_fails_with_the_root(3);
}

// A plain optimizer's archive (a checkpoint of a run without sharding) loads into every rank, each keeping the
// state of the parameters it owns, and training continues on the plain trajectory.
template <typename OptimizerType, typename Options>
void expect_plain_archive_loads(int world, const Options& options) {
  testing::run_thread_ranks(world, [&](int rank, comm::Communicator& communicator) {
    std::vector<torch::Tensor> reference = make_parameters();
    OptimizerType plain(reference, options);
    for (int step = 0; step < 3; ++step) {
      set_gradients(reference, step);
      plain.step();
    }
    std::vector<torch::Tensor> parameters = copy_of(reference);
    ZeroRedundancyOptimizer sharded(parameters, make_optimizer<OptimizerType>(options), borrow(communicator));
    load_optimizer_archive(sharded, save_optimizer_archive(plain), torch::kCPU);
    const auto& owner = sharded.partition().owner;
    EXPECT_EQ(sharded.local_optimizer().state().size(), static_cast<size_t>(std::count(owner.begin(), owner.end(), rank)));
    EXPECT_EQ(step_both(sharded, parameters, plain, reference, 3, 3), 0.0);
  });
}

TEST(ZeroRedundancyOptimizer, LoadsAPlainSgdArchiveKeepingEachRanksShare) {
  expect_plain_archive_loads<torch::optim::SGD>(3, kSgd);
}

TEST(ZeroRedundancyOptimizer, LoadsAPlainAdamArchiveKeepingEachRanksShare) {
  expect_plain_archive_loads<torch::optim::Adam>(2, kAdam);
}

// Many parameters of similar sizes, so that whole parameters can split the bytes evenly.
std::vector<torch::Tensor> many_parameters() {
  std::vector<torch::Tensor> parameters;
  auto gen = generator(9);
  for (int i = 0; i < 40; ++i) parameters.push_back(torch::randn({100 + 13 * (i % 7), 4}, gen).requires_grad_());
  return parameters;
}

TEST(ZeroRedundancyOptimizer, EachRankHoldsAboutOneOverWorldOfTheState) {
  std::vector<torch::Tensor> alone = many_parameters();
  torch::optim::Adam plain(alone, kAdam);
  set_gradients(alone, 0);
  plain.step();
  const int64_t total = optimizer_state_bytes(plain);
  for (int world : {2, 4}) {
    std::vector<int64_t> bytes(world);
    testing::run_thread_ranks(world, [&](int rank, comm::Communicator& communicator) {
      std::vector<torch::Tensor> parameters = many_parameters();
      ZeroRedundancyOptimizer sharded(parameters, make_optimizer<torch::optim::Adam>(kAdam), borrow(communicator));
      set_gradients(parameters, 0);
      sharded.step();
      bytes[rank] = optimizer_state_bytes(sharded.local_optimizer());
    });
    int64_t sum = 0;
    for (int rank = 0; rank < world; ++rank) {
      std::printf("[zero state] %d ranks: rank %d holds %lld of %lld bytes (%.3f)\n", world, rank,
                  static_cast<long long>(bytes[rank]), static_cast<long long>(total),
                  static_cast<double>(bytes[rank]) / total);
      EXPECT_LE(bytes[rank], total / world * 1.05);
      sum += bytes[rank];
    }
    EXPECT_EQ(sum, total);
  }
}

TEST(ZeroRedundancyOptimizer, RefusesAFactoryThatDoesNotKeepTheGroups) {
  OptimizerFactory drops_groups = [](std::vector<torch::optim::OptimizerParamGroup> groups) -> std::unique_ptr<Optimizer> {
    groups.push_back(torch::optim::OptimizerParamGroup(std::vector<torch::Tensor>{}));
    return std::make_unique<torch::optim::SGD>(std::move(groups), kSgd);
  };
  EXPECT_THROW(ZeroRedundancyOptimizer(make_parameters(), drops_groups, nullptr), InvalidArgument);
}

TEST(ZeroRedundancyOptimizer, RefusesParamGroupsAddedAfterConstruction) {
  std::vector<torch::Tensor> parameters = make_parameters();
  ZeroRedundancyOptimizer sharded(parameters, make_optimizer<torch::optim::SGD>(kSgd), nullptr);
  sharded.add_param_group(torch::optim::OptimizerParamGroup({torch::zeros({3}, torch::requires_grad())}));
  set_gradients(parameters, 0);
  EXPECT_THROW(sharded.step(), InvalidArgument);
}

}  // namespace
}  // namespace tandem::optim
