#include "tandem/checkpoint/weights.h"

#include <set>
#include <string_view>

#include "tandem/checkpoint/sharded_safetensors.h"
#include "tandem/fsdp/parameter_use_watch.h"
#include "tandem/util/error.h"

namespace tandem::checkpoint {
namespace {

// The model's name for a file tensor: its own, or without the "module." that PyTorch's DistributedDataParallel
// and DataParallel put in front of every name of the state dict they save.
std::string name_in_model(const std::string& file_name, const std::map<std::string, torch::Tensor>& targets) {
  constexpr std::string_view kWrapperPrefix = "module.";
  if (targets.count(file_name) || file_name.compare(0, kWrapperPrefix.size(), kWrapperPrefix) != 0) return file_name;
  return file_name.substr(kWrapperPrefix.size());
}

}  // namespace

std::vector<std::pair<std::string, torch::Tensor>> named_state(const torch::nn::Module& module) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& item : module.named_parameters()) out.emplace_back(item.key(), item.value().detach());
  for (const auto& item : module.named_buffers()) out.emplace_back(item.key(), item.value().detach());
  return out;
}

void save_weights(const torch::nn::Module& module, const std::string& path,
                  const std::map<std::string, std::string>& metadata) {
  // Between steps a module that fsdp shards holds placeholders, its values spread over the ranks' shards: this
  // reads the tensors' memory, which no collective can fill on one rank alone.
  for (const auto& entry : module.named_parameters()) {
    if (fsdp::parameter_use_watch::holds_placeholder(entry.value())) {
      throw InvalidArgument(path + ": cannot save " + entry.key() +
                            ", which fsdp shards over the ranks (this rank holds a placeholder); gather the weights "
                            "with full_parameters() on every rank and save those, or write a checkpoint");
    }
  }
  if (!path.empty() && path.back() == '/') {
    write_sharded_safetensors(path, named_state(module));
    return;
  }
  auto meta = metadata;
  meta.emplace("format", "pt");  // what Hugging Face tools expect from PyTorch weights
  save_safetensors(path, named_state(module), meta);
}

LoadReport load_weights(torch::nn::Module& module, const std::string& path, bool strict) {
  return load_weights(module, load_safetensors(path), path, strict);
}

LoadReport load_weights(torch::nn::Module& module, const TensorFile& file, const std::string& path, bool strict) {
  LoadReport report;
  std::map<std::string, torch::Tensor> targets;
  for (auto& [name, tensor] : named_state(module)) targets.emplace(name, tensor);
  std::vector<std::pair<torch::Tensor, torch::Tensor>> copies;
  // Model tensors the file has a tensor for, loaded or not: a skipped one is listed once, with its reason.
  std::set<std::string> named_in_file;
  for (const auto& [file_name, tensor] : file.tensors) {
    const std::string name = name_in_model(file_name, targets);
    auto it = targets.find(name);
    if (it == targets.end()) {
      report.skipped.push_back(file_name + " (not in the model)");
    } else if (!named_in_file.insert(name).second) {
      report.skipped.push_back(file_name + " (a second tensor for " + name + ")");
    } else if (it->second.sizes() != tensor.sizes()) {
      report.skipped.push_back(detail::concat(file_name, " (shape ", tensor.sizes(), " in the file, ",
                                              it->second.sizes(), " in the model)"));
    } else {
      report.loaded.push_back(name);
      copies.emplace_back(it->second, tensor);
    }
  }
  for (const auto& [name, tensor] : targets) {
    if (!named_in_file.count(name)) report.missing.push_back(name);
  }
  if (strict && (!report.skipped.empty() || !report.missing.empty())) {
    std::string what;
    for (const auto& s : report.skipped) what += (what.empty() ? "" : ", ") + ("unused " + s);
    for (const auto& m : report.missing) what += (what.empty() ? "" : ", ") + ("missing " + m);
    throw InvalidArgument(path + ": does not match the model exactly (`strict`): " + what);
  }
  if (report.loaded.empty() && !targets.empty()) {
    throw InvalidArgument(detail::concat(
        path, ": none of its ", file.tensors.size(), " tensors fits the model (",
        file.tensors.empty() ? std::string("the file holds none")
                             : "the file has '" + file.tensors.front().first + "', the model '" + targets.begin()->first + "'",
        "); is it a weights file of this model?"));
  }
  torch::NoGradGuard no_grad;
  for (auto& [target, source] : copies) {
    target.copy_(source.to(target.scalar_type()));
  }
  return report;
}

}  // namespace tandem::checkpoint
