#pragma once
// A registered model (nn::Model's AnyModule) shaped like a TORCH_MODULE holder: `*holder` is the module and
// `holder->forward(x)` runs it. That is the shape ddp::DistributedDataParallel wraps, so whatever --model names
// can be trained under DDP.
#include <torch/nn/modules/container/any.h>

namespace tandem::nn {

class ModelHolder {
 public:
  explicit ModelHolder(torch::nn::AnyModule module) : module_(std::move(module)) {}
  torch::nn::Module& operator*() const { return *module_.ptr(); }
  ModelHolder* operator->() { return this; }
  torch::Tensor forward(const torch::Tensor& x) { return module_.forward(x); }

 private:
  torch::nn::AnyModule module_;
};

}  // namespace tandem::nn
