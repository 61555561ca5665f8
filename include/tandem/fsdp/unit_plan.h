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
  // A module of MixedPrecision::float32_module_types: the unit keeps float32 parameters whatever param_dtype is.
  bool keeps_float32 = false;
};

// Every parameter of `root` lands in exactly one unit (a tensor registered twice, in the first that has it);
// units without parameters are left out, the root unit comes last. Refuses (InvalidArgument, one line) a policy
// that sets both fields, and one whose module_types names a type that no module under `root` is, listing the
// types it has.
// Then each module whose type is among `float32_module_types` leaves the unit the policy put it in for a unit of
// its own, marked keeps_float32, placed after that unit.
std::vector<UnitSpec> plan_units(torch::nn::Module& root, const UnitPolicy& policy,
                                 const std::vector<std::string>& float32_module_types = {});

// Per unit, the unit it runs nested in: a float32 unit split out of another (MixedPrecision::float32_module_types,
// a BatchNorm in its block) belongs to the unit of the longest module path that is a prefix of its own (the root
// unit's empty path prefixes all). The forward keeps that unit gathered while the float32 one runs, as FSDP2 keeps
// a parent gathered around its children, instead of freeing it and gathering it again after every BatchNorm.
// -1 for a unit that runs nested in none.
std::vector<int> unit_nesting(const std::vector<UnitSpec>& specs);

// Whether a module's type is one of `names` (as UnitPolicy::module_types reads them).
bool module_type_matches(const torch::nn::Module& module, const std::vector<std::string>& names);
// The shortest name module_type_matches takes for a module's type: "BasicBlock" for tandem::nn::BasicBlockImpl.
std::string short_type_name(const torch::nn::Module& module);

}  // namespace tandem::fsdp
