#include "model_compatibility.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <map>
#include <set>

#include "checkpoint_file.h"
#include "tandem/checkpoint/weights.h"
#include "tandem/util/error.h"

namespace tandem::checkpoint {
namespace {

// The first difference between the model tensors a checkpoint holds (`saved`, names without "model.") and
// `module`'s, in the module's order: a tensor only one of them has, or one of another shape; "" when none.
std::string first_model_difference(const NamedShapes& saved, const torch::nn::Module& module) {
  std::map<std::string, std::vector<int64_t>> saved_shapes(saved.begin(), saved.end());
  std::set<std::string> in_module;
  for (const auto& [name, tensor] : named_state(module)) {
    in_module.insert(name);
    auto found = saved_shapes.find(name);
    if (found == saved_shapes.end()) return fmt::format("the model's '{}' is not in the checkpoint", name);
    if (!tensor.sizes().equals(found->second)) {
      return fmt::format("'{}' is [{}] in the checkpoint, [{}] in the model", name, fmt::join(found->second, ", "),
                         fmt::join(tensor.sizes(), ", "));
    }
  }
  for (const auto& [name, shape] : saved) {
    if (!in_module.count(name)) return fmt::format("the checkpoint's '{}' is not in the model", name);
  }
  return "";
}

}  // namespace

void require_same_model(const TensorFile& file, const NamedShapes& saved, const torch::nn::Module& module,
                        const std::string& path, const std::string& saved_model_name) {
  const std::string difference = first_model_difference(saved, module);
  if (difference.empty()) return;
  const std::string trained_as =
      saved_model_name.empty() ? "" : fmt::format(" (the run was trained with `model` {})", saved_model_name);
  const std::string saved_class = saved_model_class(file, "model");
  const size_t module_tensors = named_state(module).size();
  const std::string models =
      saved_class == module.name() && saved.size() == module_tensors
          ? ""
          : fmt::format("the checkpoint holds a {} of {} tensors, this run's model is a {} of {}, and ", saved_class,
                        saved.size(), module.name(), module_tensors);
  throw InvalidArgument(fmt::format("{} was written for another model{}: {}{}; resume with the `model` and "
                                    "`num_classes` the run was trained with, or start a new run in another `run_dir`",
                                    path, trained_as, models, difference));
}

}  // namespace tandem::checkpoint
