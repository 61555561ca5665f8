#pragma once
// The model and optimizer the checkpoint fuzzer restores into, shared with the seed writer so that the seed
// checkpoint fits them and the fuzzer starts from a file load_checkpoint accepts.
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

namespace tandem::fuzz {

struct CheckpointModel {
  torch::nn::Linear model{3, 2};  // tensors weight [2, 3] and bias [2]
  torch::optim::SGD optimizer{model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9)};
};

}  // namespace tandem::fuzz
