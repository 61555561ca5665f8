#pragma once
// The optimizer's state in a checkpoint: LibTorch's own archive of it (Optimizer::save) under kOptimizerArchive,
// recorded by its kind and fingerprint, and restored only into an optimizer of the same kind built against the
// same LibTorch major version. Internal to checkpoint/.
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <string>

#include "tandem/checkpoint/safetensors.h"

namespace tandem::checkpoint {

inline constexpr const char* kOptimizerArchive = "optimizer.archive";

// What the checkpoint records the archive by, so that damage to it is found before LibTorch parses it.
std::string archive_fingerprint(const torch::Tensor& archive);

// The optimizer's state from the file's archive, after checking its kind and LibTorch version.
void restore_optimizer(const TensorFile& file, const std::string& path, torch::optim::Optimizer& optimizer,
                       const std::string& kind, torch::Device device);
// tandem-checkpoint-1 held SGD momentum buffers by parameter name, the only optimizer tandem had then.
void restore_first_format_momentum(const TensorFile& file, const std::string& path, const torch::nn::Module& module,
                                   torch::optim::Optimizer& optimizer, const std::string& kind);

}  // namespace tandem::checkpoint
