#pragma once
// The memory measurement behind `tandem bench memory`: one rank trains a few AdamW steps of a model under DDP or
// FSDP and reports what it held, counted two ways:
//   - tensors, counted as ZeRO's tests count them: parameters (FSDP: the shards), gradients (FSDP: the shards'),
//     optimizer state (optim::optimizer_state_bytes), and under FSDP the most gathered bytes at once;
//   - the process's peak resident memory (VmHWM in /proc/self/status): once after the model is built and wrapped
//     (each rank builds the whole model before it is sharded), then, reset, over the training steps alone.
// The model is a registry model (--model) or a wide MLP of a given parameter count (WideMlp), the large-model case.
#include <cstdint>
#include <string>

#include "tandem/comm/communicator.h"

namespace tandem::bench {

struct MemoryBenchOptions {
  std::string strategy = "fsdp";  // fsdp or ddp
  // "mlp": WideMlp of about mlp_parameters; anything else: a model of the registry on images of image_size.
  std::string model = "mlp";
  int64_t mlp_parameters = 100'000'000;
  int64_t mlp_width = 8192;
  int64_t image_size = 32;
  int batch_size = 8;  // per rank
  int steps = 3;
  bool reshard_after_forward = true;  // fsdp
  uint64_t seed = 0;
};

// "600M" -> 600 000 000: a whole number with an optional decimal unit K, M or G (10^3, 10^6, 10^9), from 1 to
// 10^12. Throws InvalidArgument on anything else.
int64_t parse_parameter_count(const std::string& text);

// The wide MLP's shape for about `parameters` parameters: `layers` hidden width x width layers, then width -> 10.
struct MlpShape {
  int64_t width = 0;
  int64_t layers = 0;
  int64_t parameters() const { return layers * (width * width + width) + width * 10 + 10; }
};
// Throws InvalidArgument naming --mlp-params when even one layer of `width` is more than `parameters`.
MlpShape mlp_shape(int64_t parameters, int64_t width);

// The model's parameter count, from its shape alone (nothing allocated for the MLP; a registry model is built).
int64_t model_parameters(const MemoryBenchOptions& options);

struct MemoryBenchResult {
  int rank = 0;
  int world_size = 1;
  int64_t model_parameters = 0;
  int64_t parameter_bytes = 0;  // held by this rank: DDP the whole model, FSDP its shards
  int64_t gradient_bytes = 0;
  int64_t optimizer_state_bytes = 0;
  int64_t peak_gathered_bytes = 0;  // FSDP: most gathered and in-flight parameter bytes at once; DDP 0
  int64_t largest_unit_bytes = 0;   // FSDP: the largest unit's unsharded bytes; DDP 0
  int64_t peak_resident_build = 0;  // VmHWM after building and wrapping the model
  int64_t peak_resident_train = 0;  // VmHWM over the steps, reset after building; -1 where it cannot be reset
  double ms_per_step = 0;           // median of the steps after the first, this rank's
};

// Collective where `communicator` is not null (every rank calls it). `communicator` null: one process alone,
// under DDP's optimizer and gradients but no wrapper (nothing to reduce).
MemoryBenchResult run_memory_bench(const MemoryBenchOptions& options, const comm::CommunicatorPtr& communicator);

// This process's VmHWM in bytes, or -1 where /proc/self/status has none.
int64_t peak_resident_bytes();

}  // namespace tandem::bench
