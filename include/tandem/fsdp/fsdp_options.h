#pragma once
// What fully sharded data parallel is told: where the units are cut and when a unit's parameters are freed.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace tandem::fsdp {

// Which modules become units (each unit's parameters are flattened, sharded and gathered together). With
// neither field set, each direct child of the root is a unit. Whatever no unit takes (the root's own
// parameters, a child that matched nothing) forms the root unit.
struct UnitPolicy {
  // PyTorch's size-based policy: walking the tree children first, a module becomes a unit of the parameters
  // its subtree still holds once they reach this count (the root excepted).
  std::optional<int64_t> min_parameters;
  // Every module whose type is named here becomes a unit, its subtree included: the class name as
  // Module::name() gives it ("tandem::nn::BasicBlockImpl"), its last component, or that without "Impl"
  // ("BasicBlock", "Conv2d").
  std::vector<std::string> module_types;
};

struct FsdpOptions {
  UnitPolicy units;
  // true (ZeRO-3): a unit's parameters are freed as soon as the forward moves on to another unit, and
  // gathered again in backward. false: they stay gathered from forward until the unit's gradients are
  // reduce-scattered in backward (more memory, one all-gather fewer per unit and step).
  bool reshard_after_forward = true;
  // Broadcast the buffers (BatchNorm's running statistics) from rank 0 at every forward, as DDP does, so that
  // every rank evaluates and saves the same model.
  bool broadcast_buffers = true;
};

}  // namespace tandem::fsdp
