#pragma once
// A tandem checkpoint's optimizer state in PyTorch's terms, for `tandem convert --format dcp`: read from LibTorch's
// archive of it (checkpoint_optimizer.h) without the model or the optimizer, by the archive's own layout (its
// param group's parameter keys, each key's state, the group's options). Internal to checkpoint/.
#include <string>
#include <utility>
#include <vector>

#include "tandem/checkpoint/distributed_checkpoint.h"
#include "tandem/checkpoint/safetensors.h"

namespace tandem::checkpoint {

struct ExportedOptimizer {
  // `optimizer.state.<parameter>.<field>`: each parameter's step (float32, 0-dimensional, as PyTorch 2.x keeps it)
  // and, where the archive holds them (a full checkpoint), its per-element tensors.
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  // `optimizer.param_groups.0.<key>`: every key PyTorch's optimizer of that kind has, LibTorch's options where it has
  // them, PyTorch's defaults for the rest, and `params`, the parameters' names.
  std::vector<ByteEntry> param_group;
  std::string optimizer;  // PyTorch's class: "AdamW", "Adam", "SGD", "RMSprop"
};

// The state of the checkpoint file `file` (read from `path`). `tensors` are the model's tensors by name and shape in
// the checkpoint's order, parameters first: the optimizer's parameters are the first as many as its group holds
// (a run that froze layers, whose optimizer holds others, is found out by the shapes of their state where the
// archive holds tensors). Throws InvalidArgument naming the file when the archive is of another optimizer, of more
// parameters, or damaged.
ExportedOptimizer export_optimizer_state(const TensorFile& file, const std::string& path,
                                         const std::vector<std::pair<std::string, std::vector<int64_t>>>& tensors);

}  // namespace tandem::checkpoint
