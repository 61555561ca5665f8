#include "tandem/nn/model_registry.h"

#include <map>

#include "tandem/util/error.h"

namespace tandem::nn {
namespace {

struct Entry {
  std::string description;
  ModelFactory factory;
};

// Function-local so registrations from other translation units never run before it exists.
std::map<std::string, Entry>& registry() {
  static std::map<std::string, Entry> entries;
  return entries;
}

}  // namespace

void register_model(const std::string& name, const std::string& description, ModelFactory factory) {
  if (!registry().emplace(name, Entry{description, std::move(factory)}).second) {
    throw InvalidArgument("model '" + name + "' is registered twice");
  }
}

Model make_model(const std::string& name, const ModelOptions& options) {
  auto it = registry().find(name);
  if (it == registry().end()) {
    std::string known;
    for (const auto& [known_name, entry] : registry()) known += (known.empty() ? "" : ", ") + known_name;
    throw InvalidArgument("unknown model '" + name + "'; registered models: " + known);
  }
  return it->second.factory(options);
}

std::vector<std::pair<std::string, std::string>> registered_models() {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& [name, entry] : registry()) out.emplace_back(name, entry.description);
  return out;
}

std::vector<std::string> freeze_all_but_head(Model& model) {
  std::vector<std::string> trainable;
  for (auto& item : model.module.ptr()->named_parameters()) {
    bool in_head = false;
    for (const auto& prefix : model.head_prefixes) in_head = in_head || item.key().rfind(prefix, 0) == 0;
    item.value().requires_grad_(in_head);
    if (in_head) trainable.push_back(item.key());
  }
  if (trainable.empty()) throw InvalidArgument("`freeze_layers` would freeze every parameter of this model");
  return trainable;
}

std::vector<torch::Tensor> trainable_parameters(const Model& model) {
  std::vector<torch::Tensor> trainable;
  for (const auto& parameter : model.module.ptr()->parameters()) {
    if (parameter.requires_grad()) trainable.push_back(parameter);
  }
  return trainable;
}

}  // namespace tandem::nn
