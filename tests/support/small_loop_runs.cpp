#include "support/small_loop_runs.h"

#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/linear.h>
#include <torch/utils.h>

namespace tandem::testing {

torch::nn::Sequential small_classifier(uint64_t seed) {
  torch::manual_seed(seed);
  return torch::nn::Sequential(torch::nn::Linear(8, 16), torch::nn::Tanh(), torch::nn::Linear(16, 2));
}

train::LoopOptions small_loop_options(train::Strategy strategy, const std::string& run_dir, int64_t stop_after) {
  train::LoopOptions options;
  options.epochs = 3;
  options.batch_size = 8;
  options.run_dir = run_dir;
  options.progress = false;
  options.max_steps = stop_after;
  options.strategy = strategy;
  return options;
}

comm::CommunicatorPtr borrowed(comm::Communicator& communicator) {
  return comm::CommunicatorPtr(&communicator, [](comm::Communicator*) {});
}

}  // namespace tandem::testing
