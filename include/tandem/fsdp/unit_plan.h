#pragma once
// Cutting a module tree into FSDP units by a UnitPolicy, before anything is sharded.
#include <torch/nn/module.h>

#include <string>
#include <utility>
#include <vector>

#include "tandem/fsdp/fsdp_options.h"

namespace tandem::fsdp {

struct UnitSpec {
  // The module's path in the tree ("layer1", "layer2.0"); empty for the root unit.
  std::string name;
  // The unit's parameters with their full names in the root's state dict, in registration order.
  std::vector<std::pair<std::string, torch::Tensor>> parameters;
};

// Every parameter of `root` lands in exactly one unit (a tensor registered twice, in the first that has it);
// units without parameters are left out, the root unit comes last. Refuses a policy that sets both fields.
std::vector<UnitSpec> plan_units(torch::nn::Module& root, const UnitPolicy& policy);

// Whether a module's type is one of `names` (as UnitPolicy::module_types reads them).
bool module_type_matches(const torch::nn::Module& module, const std::vector<std::string>& names);

}  // namespace tandem::fsdp
