#pragma once
// The optimizers whose state the training loop's checkpoints and FSDP's shards must carry over, each with the
// options that give it more state than the default (momentum, amsgrad, centered), over a Sequential: the
// parameters of the tests that stop a run and continue it.
#include <gtest/gtest.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/optim.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace tandem::testing {

using OptimizerFactory = std::function<std::unique_ptr<torch::optim::Optimizer>(torch::nn::Sequential&)>;

struct OptimizerCase {
  const char* name;
  OptimizerFactory make;
};

// SGD (momentum, weight decay), Adam (amsgrad), AdamW and RMSprop (centered, momentum).
inline std::vector<OptimizerCase> stateful_optimizer_cases() {
  return {
      {"SGD",
       [](torch::nn::Sequential& net) -> std::unique_ptr<torch::optim::Optimizer> {
         return std::make_unique<torch::optim::SGD>(net->parameters(),
                                                    torch::optim::SGDOptions(0.05).momentum(0.9).weight_decay(0.005));
       }},
      {"Adam",
       [](torch::nn::Sequential& net) -> std::unique_ptr<torch::optim::Optimizer> {
         return std::make_unique<torch::optim::Adam>(net->parameters(), torch::optim::AdamOptions(1e-2).amsgrad(true));
       }},
      {"AdamW",
       [](torch::nn::Sequential& net) -> std::unique_ptr<torch::optim::Optimizer> {
         return std::make_unique<torch::optim::AdamW>(net->parameters(),
                                                      torch::optim::AdamWOptions(1e-2).weight_decay(0.05));
       }},
      {"RMSprop",
       [](torch::nn::Sequential& net) -> std::unique_ptr<torch::optim::Optimizer> {
         return std::make_unique<torch::optim::RMSprop>(
             net->parameters(), torch::optim::RMSpropOptions(1e-2).momentum(0.5).centered(true));
       }},
  };
}

inline std::string optimizer_case_name(const ::testing::TestParamInfo<OptimizerCase>& info) {
  return info.param.name;
}

}  // namespace tandem::testing
