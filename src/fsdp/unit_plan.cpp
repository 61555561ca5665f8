#include "tandem/fsdp/unit_plan.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "tandem/util/error.h"

namespace tandem::fsdp {
namespace {

using NamedParameters = std::vector<std::pair<std::string, torch::Tensor>>;

// "tandem::nn::BasicBlockImpl" -> "BasicBlockImpl"
std::string last_component(const std::string& type) {
  const size_t colon = type.rfind("::");
  return colon == std::string::npos ? type : type.substr(colon + 2);
}

std::string join(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

int64_t count(const NamedParameters& parameters) {
  int64_t total = 0;
  for (const auto& entry : parameters) total += entry.second.numel();
  return total;
}

// Builds the units while remembering which tensors are taken, so that a shared tensor joins one unit only.
class Planner {
 public:
  void add_unit(const std::string& name, const NamedParameters& parameters) {
    UnitSpec unit{name, {}};
    for (const auto& entry : parameters) {
      if (taken_.insert(entry.second.unsafeGetTensorImpl()).second) unit.parameters.push_back(entry);
    }
    if (!unit.parameters.empty()) units_.push_back(std::move(unit));
  }

  NamedParameters subtree(const std::string& prefix, torch::nn::Module& module) const {
    NamedParameters result;
    for (const auto& entry : module.named_parameters(/*recurse=*/true)) {
      result.emplace_back(join(prefix, entry.key()), entry.value());
    }
    return result;
  }

  // Children first: what a child's subtree still holds becomes a unit once it reaches `minimum`; the rest
  // goes up to the parent.
  NamedParameters by_size(const std::string& prefix, torch::nn::Module& module, int64_t minimum, bool is_root) {
    NamedParameters left;
    for (const auto& entry : module.named_parameters(/*recurse=*/false)) {
      left.emplace_back(join(prefix, entry.key()), entry.value());
    }
    for (const auto& child : module.named_children()) {
      NamedParameters rest = by_size(join(prefix, child.key()), *child.value(), minimum, false);
      left.insert(left.end(), rest.begin(), rest.end());
    }
    if (!is_root && count(left) >= minimum) {
      add_unit(prefix, left);
      return {};
    }
    return left;
  }

  void by_type(const std::string& prefix, torch::nn::Module& module, const std::vector<std::string>& types) {
    for (const auto& child : module.named_children()) {
      const std::string path = join(prefix, child.key());
      if (module_type_matches(*child.value(), types)) {
        add_unit(path, subtree(path, *child.value()));
      } else {
        by_type(path, *child.value(), types);
      }
    }
  }

  std::vector<UnitSpec> finish(torch::nn::Module& root) {
    add_unit("", subtree("", root));  // whatever no unit took
    return std::move(units_);
  }

 private:
  std::unordered_set<const c10::TensorImpl*> taken_;
  std::vector<UnitSpec> units_;
};

// Moves the parameters of every module of `types` out of the units into units of their own, each placed after
// the unit it came from.
std::vector<UnitSpec> split_float32_modules(torch::nn::Module& root, std::vector<UnitSpec> units,
                                            const std::vector<std::string>& types) {
  std::unordered_map<const c10::TensorImpl*, std::string> owner;  // parameter -> its float32 module's path
  for (const auto& entry : root.named_modules("", /*include_self=*/false)) {
    if (!module_type_matches(*entry.value(), types)) continue;
    for (const auto& parameter : entry.value()->parameters()) owner.emplace(parameter.unsafeGetTensorImpl(), entry.key());
  }
  if (owner.empty()) return units;
  std::vector<UnitSpec> result;
  for (UnitSpec& unit : units) {
    UnitSpec rest{unit.name, {}, unit.keeps_float32};
    std::vector<UnitSpec> kept;
    for (auto& entry : unit.parameters) {
      auto found = owner.find(entry.second.unsafeGetTensorImpl());
      if (found == owner.end()) {
        rest.parameters.push_back(std::move(entry));
        continue;
      }
      auto same = std::find_if(kept.begin(), kept.end(), [&](const UnitSpec& k) { return k.name == found->second; });
      if (same == kept.end()) same = kept.insert(kept.end(), UnitSpec{found->second, {}, true});
      same->parameters.push_back(std::move(entry));
    }
    if (!rest.parameters.empty()) result.push_back(std::move(rest));
    for (UnitSpec& k : kept) result.push_back(std::move(k));
  }
  return result;
}

// A name of `policy.module_types` that no module under the root is: a typo would otherwise leave the model in
// one root unit, which trains, only without the sharding the policy asked for.
void require_every_type_present(torch::nn::Module& root, const UnitPolicy& policy) {
  const auto modules = root.named_modules("", /*include_self=*/false);
  for (const std::string& name : policy.module_types) {
    const bool present = std::any_of(modules.begin(), modules.end(),
                                     [&](const auto& entry) { return module_type_matches(*entry.value(), {name}); });
    if (present) continue;
    std::vector<std::string> types;
    for (const auto& entry : modules) {
      const std::string type = short_type_name(*entry.value());
      if (std::find(types.begin(), types.end(), type) == types.end()) types.push_back(type);
    }
    throw InvalidArgument(fmt::format("fsdp unit policy module_types names '{}', which no module of the model is; "
                                      "its modules are of the types {}",
                                      name, types.empty() ? "(none: the model has no submodules)"
                                                          : fmt::format("{}", fmt::join(types, ", "))));
  }
}

}  // namespace

std::string short_type_name(const torch::nn::Module& module) {
  const std::string last = last_component(module.name());
  return last.size() > 4 && last.compare(last.size() - 4, 4, "Impl") == 0 ? last.substr(0, last.size() - 4) : last;
}

bool module_type_matches(const torch::nn::Module& module, const std::vector<std::string>& names) {
  const std::string& full = module.name();
  const std::string last = last_component(full);
  const std::string bare = short_type_name(module);
  return std::any_of(names.begin(), names.end(),
                     [&](const std::string& name) { return name == full || name == last || name == bare; });
}

std::vector<UnitSpec> plan_units(torch::nn::Module& root, const UnitPolicy& policy,
                                 const std::vector<std::string>& float32_module_types) {
  if (policy.min_parameters && !policy.module_types.empty()) {
    throw InvalidArgument("fsdp unit policy sets both min_parameters and module_types; choose one");
  }
  if (policy.min_parameters && *policy.min_parameters < 1) {
    throw InvalidArgument("fsdp unit policy min_parameters is " + std::to_string(*policy.min_parameters) +
                          "; it must be at least 1");
  }
  require_every_type_present(root, policy);
  Planner planner;
  if (policy.min_parameters) {
    planner.by_size("", root, *policy.min_parameters, /*is_root=*/true);
  } else if (!policy.module_types.empty()) {
    planner.by_type("", root, policy.module_types);
  } else {
    for (const auto& child : root.named_children()) {
      planner.add_unit(child.key(), planner.subtree(child.key(), *child.value()));
    }
  }
  return split_float32_modules(root, planner.finish(root), float32_module_types);
}

std::vector<int> unit_nesting(const std::vector<UnitSpec>& specs) {
  std::vector<int> nested_in(specs.size(), -1);
  for (size_t unit = 0; unit < specs.size(); ++unit) {
    if (!specs[unit].keeps_float32) continue;
    const std::string& path = specs[unit].name;
    size_t longest = 0;
    for (size_t other = 0; other < specs.size(); ++other) {
      const std::string& prefix = specs[other].name;
      if (specs[other].keeps_float32) continue;
      const bool contains = prefix.empty() || (path.size() > prefix.size() && path[prefix.size()] == '.' &&
                                               path.compare(0, prefix.size(), prefix) == 0);
      if (contains && (nested_in[unit] < 0 || prefix.size() >= longest)) {
        nested_in[unit] = static_cast<int>(other);
        longest = prefix.size();
      }
    }
  }
  return nested_in;
}

}  // namespace tandem::fsdp
