#pragma once
// Any model, shaped like a TORCH_MODULE holder: `*holder` is the module and `holder->forward(x)` runs it. That is
// the shape ddp::DistributedDataParallel wraps, so the training loop (train/loop.h) and `tandem train` can take a
// registry model (an AnyModule), a user's TORCH_MODULE, a torch::nn::Sequential (which AnyModule cannot hold:
// its forward is a template) or a std::shared_ptr to a module, and train each under DDP alike.
//
// A holder made by hold_model() can also copy its model (clone), which dp::DataParallel needs for its replicas:
// hold_model() is where the concrete module type is still known, and LibTorch's clone() returns a bare Module.
#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>

#include <functional>
#include <memory>
#include <type_traits>
#include <utility>

#include "tandem/util/error.h"

namespace tandem::nn {

class ModelHolder {
 public:
  // images -> the model's output (logits for a classifier)
  using Forward = std::function<torch::Tensor(const torch::Tensor&)>;
  // A deep copy of the model on a device: its own parameters and buffers, with the model's values.
  using Clone = std::function<ModelHolder(const torch::Device&)>;

  // Without `clone` the holder cannot copy its model (clone() throws).
  ModelHolder(std::shared_ptr<torch::nn::Module> module, Forward forward, Clone clone = nullptr)
      : module_(std::move(module)), forward_(std::move(forward)), clone_(std::move(clone)) {}
  explicit ModelHolder(torch::nn::AnyModule module)
      : ModelHolder(
            module.ptr(), [module](const torch::Tensor& x) mutable { return module.forward(x); },
            [module](const torch::Device& device) { return ModelHolder(module.clone(device)); }) {}

  torch::nn::Module& operator*() const { return *module_; }
  ModelHolder* operator->() { return this; }
  torch::Tensor forward(const torch::Tensor& x) { return forward_(x); }

  // Throws InvalidArgument for a holder built from a bare (module, forward) pair; LibTorch's clone() throws
  // c10::Error for a module (or a child of it) that is not a torch::nn::Cloneable.
  ModelHolder clone(const torch::Device& device) const {
    if (!clone_) {
      throw InvalidArgument(detail::concat("cannot copy the model ", module_->name(),
                                           ": it was held as a bare (module, forward) pair; pass the module itself "
                                           "(a TORCH_MODULE holder, std::shared_ptr or AnyModule) instead"));
    }
    return clone_(device);
  }

 private:
  std::shared_ptr<torch::nn::Module> module_;
  Forward forward_;
  Clone clone_;
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
    return ModelHolder(
        std::move(module), [model](const torch::Tensor& x) { return model->forward(x); },
        [model](const torch::Device& device) {
          return hold_model(std::dynamic_pointer_cast<typename Model::element_type>(model->clone(device)));
        });
  } else {
    return ModelHolder(
        model.ptr(), [model](const torch::Tensor& x) mutable { return model->forward(x); },
        [model](const torch::Device& device) {
          return hold_model(Model(std::dynamic_pointer_cast<typename Model::ContainedType>(model->clone(device))));
        });
  }
}

}  // namespace tandem::nn
