#pragma once
// `--model NAME` -> a freshly initialised model. Each model file registers itself with one line at namespace
// scope in its .cpp (the library is shared, so every registration runs when it loads):
//
//   const tandem::nn::ModelRegistration kRegisterResNet18("resnet18", "ResNet-18",
//       [](const tandem::nn::ModelOptions& o) { return tandem::nn::Model{torch::nn::AnyModule(ResNet18(o)), {"fc."}}; });
//
// Initial weights come from LibTorch's default initialisers, so seed with torch::manual_seed() first.
#include <torch/nn/modules/container/any.h>

#include <functional>
#include <string>
#include <vector>

namespace tandem::nn {

// What every model factory is given: the data set's shape.
struct ModelOptions {
  int64_t num_classes = 10;
  int64_t in_channels = 1;
  int64_t image_size = 28;
};

struct Model {
  // forward(images [N, C, H, W]) -> logits [N, num_classes].
  torch::nn::AnyModule module;
  // Parameter name prefixes of the classifier head: what freeze_all_but_head() leaves trainable.
  std::vector<std::string> head_prefixes;
};

using ModelFactory = std::function<Model(const ModelOptions&)>;

// Throws InvalidArgument if `name` is already taken.
void register_model(const std::string& name, const std::string& description, ModelFactory factory);
// Throws InvalidArgument naming the registered models if `name` is unknown.
Model make_model(const std::string& name, const ModelOptions& options = {});
// Registered names, sorted, each with its description.
std::vector<std::pair<std::string, std::string>> registered_models();

struct ModelRegistration {
  ModelRegistration(const std::string& name, const std::string& description, ModelFactory factory) {
    register_model(name, description, std::move(factory));
  }
};

// Sets requires_grad=false on every parameter outside `model.head_prefixes`; returns the trainable names.
std::vector<std::string> freeze_all_but_head(Model& model);
// The parameters that still require a gradient: what the optimizer takes (all of them unless frozen).
std::vector<torch::Tensor> trainable_parameters(const Model& model);

}  // namespace tandem::nn
