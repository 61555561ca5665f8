#pragma once
// Any model, shaped like a TORCH_MODULE holder: `*holder` is the module and `holder->forward(x)` runs it. That is
// the shape ddp::DistributedDataParallel wraps, so the training loop (train/loop.h) and `tandem train` can take a
// registry model (an AnyModule), a user's TORCH_MODULE, a torch::nn::Sequential (which AnyModule cannot hold:
// its forward is a template) or a std::shared_ptr to a module, and train each under DDP alike.
#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>

#include <functional>
#include <memory>
#include <type_traits>
#include <utility>

namespace tandem::nn {

class ModelHolder {
 public:
  // images -> the model's output (logits for a classifier)
  using Forward = std::function<torch::Tensor(const torch::Tensor&)>;

  ModelHolder(std::shared_ptr<torch::nn::Module> module, Forward forward)
      : module_(std::move(module)), forward_(std::move(forward)) {}
  explicit ModelHolder(torch::nn::AnyModule module)
      : ModelHolder(module.ptr(), [module](const torch::Tensor& x) mutable { return module.forward(x); }) {}

  torch::nn::Module& operator*() const { return *module_; }
  ModelHolder* operator->() { return this; }
  torch::Tensor forward(const torch::Tensor& x) { return forward_(x); }

 private:
  std::shared_ptr<torch::nn::Module> module_;
  Forward forward_;
};

// A ModelHolder for any module holder (TORCH_MODULE type, Sequential), std::shared_ptr<SomeModule> or AnyModule
// whose forward takes one tensor.
template <typename Model>
ModelHolder hold_model(Model model) {
  if constexpr (std::is_same_v<Model, ModelHolder>) {
    return model;
  } else if constexpr (std::is_same_v<Model, torch::nn::AnyModule>) {
    return ModelHolder(std::move(model));
  } else if constexpr (std::is_convertible_v<Model, std::shared_ptr<torch::nn::Module>>) {
    std::shared_ptr<torch::nn::Module> module = model;
    return ModelHolder(std::move(module), [model](const torch::Tensor& x) { return model->forward(x); });
  } else {
    return ModelHolder(model.ptr(), [model](const torch::Tensor& x) mutable { return model->forward(x); });
  }
}

}  // namespace tandem::nn
