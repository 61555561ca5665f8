// The measurement behind BENCHMARKS.md's ZeRO figures: optimizer-state bytes per rank for ResNet-18 (11.2 M
// parameters at 10 classes) with SGD momentum and with Adam, at 1, 2 and 4 ranks (threads), after one step.
// Prints a table:
//   build/tests/tandem_optim_tests --gtest_filter='ZeroStateBytes.*'
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>

#include "support/thread_ranks.h"
#include "tandem/nn/model_registry.h"
#include "tandem/optim/state_bytes.h"
#include "tandem/optim/zero_redundancy_optimizer.h"

namespace tandem::optim {
namespace {

// Each rank's state bytes after one step of ZeroRedundancyOptimizer over ResNet-18 on `world` ranks.
std::vector<int64_t> bytes_per_rank(int world, const OptimizerFactory& make_optimizer) {
  std::vector<int64_t> bytes(world);
  testing::run_thread_ranks(
      world,
      [&](int rank, comm::Communicator& communicator) {
        nn::Model model = nn::make_model("resnet18", nn::ModelOptions{10, 3, 32});
        std::vector<torch::Tensor> parameters = model.module.ptr()->parameters();
        for (auto& parameter : parameters) parameter.mutable_grad() = torch::full_like(parameter, 1e-3);
        ZeroRedundancyOptimizer optimizer(parameters, make_optimizer,
                                          comm::CommunicatorPtr(&communicator, [](comm::Communicator*) {}));
        optimizer.step();
        bytes[rank] = optimizer_state_bytes(optimizer.local_optimizer());
      },
      std::chrono::seconds(120));
  return bytes;
}

TEST(ZeroStateBytes, ResNet18PerRankAtOneTwoAndFourRanks) {
  const std::vector<std::pair<const char*, OptimizerFactory>> optimizers = {
      {"SGD momentum", make_optimizer<torch::optim::SGD>(torch::optim::SGDOptions(0.1).momentum(0.9))},
      {"Adam", make_optimizer<torch::optim::Adam>(torch::optim::AdamOptions(1e-3))}};
  std::printf("%-13s %5s %15s %15s %9s\n", "optimizer", "ranks", "largest rank", "smallest rank", "largest/1");
  for (const auto& [name, make_optimizer] : optimizers) {
    int64_t whole = 0;
    for (int world : {1, 2, 4}) {
      const std::vector<int64_t> bytes = bytes_per_rank(world, make_optimizer);
      const int64_t largest = *std::max_element(bytes.begin(), bytes.end());
      const int64_t smallest = *std::min_element(bytes.begin(), bytes.end());
      if (world == 1) whole = largest;
      std::printf("%-13s %5d %15lld %15lld %9.3f\n", name, world, static_cast<long long>(largest),
                  static_cast<long long>(smallest), static_cast<double>(largest) / whole);
      // Whole parameters cannot split ResNet-18's 2.4 M-element convolutions evenly: within 10% of an even share.
      EXPECT_LE(static_cast<double>(largest) / whole, 1.1 / world);
    }
  }
}

}  // namespace
}  // namespace tandem::optim
