#pragma once
// What fully sharded data parallel is told: where the units are cut, when a unit's parameters are freed, and in
// which dtypes it computes and reduces.
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace tandem::comm {
class Communicator;
}

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

// PyTorch FSDP2's MixedPrecisionPolicy. The shards, which the optimizer steps, stay float32 (the masters); each
// gather casts the shard to param_dtype before the all-gather, so the module computes on param_dtype parameters
// and the traffic and the gathered memory shrink with the dtype. Gradients arrive in param_dtype and are
// reduce-scattered in reduce_dtype, then added into the float32 shard gradients. docs/fsdp.md, "Mixed precision".
struct MixedPrecision {
  // float32, bfloat16 or float16 (float16 computes on the CPU from LibTorch 2.x only).
  c10::ScalarType param_dtype = c10::ScalarType::Float;
  // float32, bfloat16 or float16; none: param_dtype, as PyTorch's default. A low-precision reduction sums the
  // ranks' gradients rounded to it; float32 sums them exactly as they came. A backend that cannot reduce the dtype
  // (1.13's Gloo and bfloat16) is refused at construction.
  std::optional<c10::ScalarType> reduce_dtype;
  // The floating tensors among the wrapper's forward arguments are cast to param_dtype, so that the first unit
  // gets inputs of its parameters' dtype (PyTorch casts the root's forward inputs the same way).
  bool cast_forward_inputs = true;
  // Modules of these types keep float32 parameters in units of their own (FSDP1's default exception): LibTorch's
  // batch_norm refuses low-precision weights beside float32 running statistics, on 1.13 and 2.x alike, and takes
  // a low-precision input with float32 weights. Named as UnitPolicy::module_types.
  std::vector<std::string> float32_module_types = {"BatchNorm1d", "BatchNorm2d", "BatchNorm3d"};

  c10::ScalarType reduce_dtype_or_param() const { return reduce_dtype.value_or(param_dtype); }
};

// Refuses (one line) dtypes other than float32, bfloat16 and float16, and a reduce_dtype that `communicator`'s
// backend cannot reduce: every rank probes with one reduce-scatter, so all refuse alike before any unit is sent.
// Without a communicator, or in a world of one, only the dtypes are checked.
void require_supported(const MixedPrecision& precision, comm::Communicator* communicator);

struct FsdpOptions {
  UnitPolicy units;
  // true (ZeRO-3): a unit's parameters are freed as soon as the forward moves on to another unit, and
  // gathered again in backward. false: they stay gathered from forward until the unit's gradients are
  // reduce-scattered in backward (more memory, one all-gather fewer per unit and step).
  bool reshard_after_forward = true;
  // Broadcast the buffers (BatchNorm's running statistics) from rank 0 at every forward, as DDP does, so that
  // every rank evaluates and saves the same model.
  bool broadcast_buffers = true;
  MixedPrecision mixed_precision;
};

}  // namespace tandem::fsdp
