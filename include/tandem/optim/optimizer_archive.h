#pragma once
// An optimizer's own serialization (Optimizer::save) as flat bytes, and back. The archive knows every optimizer's
// per-parameter state (and a user's optimizer that implements save/load), which tandem then need not enumerate:
// checkpoints store it as a tensor, ZeroRedundancyOptimizer sends it between ranks.
//
// LibTorch's archive names the parameters by address but reads their state back by position in the param groups:
// an archive fits any optimizer of the same kind whose groups hold parameters of the same shapes in the same order.
#include <torch/optim/optimizer.h>
#include <torch/types.h>

namespace tandem::optim {

// A one-dimensional uint8 tensor on the CPU.
torch::Tensor save_optimizer_archive(const torch::optim::Optimizer& optimizer);

// Loads `bytes` (as save_optimizer_archive returns them) into `optimizer`, its state tensors placed on `device`.
// LibTorch's own errors (c10::Error) come through for the caller to name the source.
void load_optimizer_archive(torch::optim::Optimizer& optimizer, const torch::Tensor& bytes, torch::Device device);

}  // namespace tandem::optim
