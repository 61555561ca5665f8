// A whole checkpoint saved and restored (checkpoint.h) through the main file's one path (checkpoint_file.h): on
// load, the model's fit first, then its weights, the optimizer's state and, for a sharded checkpoint read whole,
// its pieces.
#include "tandem/checkpoint/checkpoint.h"

#include <fmt/format.h>

#include <optional>

#include "checkpoint_file.h"
#include "checkpoint_optimizer.h"
#include "model_compatibility.h"
#include "sharded_gather.h"
#include "tandem/checkpoint/checkpoint_format.h"
#include "tandem/checkpoint/weights.h"
#include "tandem/optim/optimizer_archive.h"
#include "tandem/optim/zero_redundancy_optimizer.h"
#include "tandem/util/error.h"
#include "tandem/util/log.h"

namespace tandem::checkpoint {
namespace {

// `per_parameter_state`: whether the optimizer keeps each parameter's state where fill_parameter_states can put
// it (not a ZeroRedundancyOptimizer, whose state only its archive fills).
CheckpointState load_checkpoint_of_kind(const std::string& path, torch::nn::Module& module,
                                        torch::optim::Optimizer& optimizer, const std::string& kind,
                                        bool per_parameter_state, ExtraState* extra) {
  const TensorFile file = read_checkpoint_file(path);
  const StoredFormat format = stored_format(file.metadata);
  if (!has_checksums(format)) {
    log::main_info("{} is a {} checkpoint, written before checkpoints carried checksums: it is loaded unverified",
                   path, format == StoredFormat::kFirst ? kFirstCheckpointFormat : kSecondCheckpointFormat);
  }
  CheckpointState state = read_state(file, path);

  TensorFile model_part = stored_model_tensors(file);
  NamedShapes shapes;
  // A sharded checkpoint's parameters are gathered whole from its pieces: this rank holds the whole model anyway.
  std::optional<ShardedCheckpointReader> pieces;
  if (format == StoredFormat::kSharded) {
    if (!per_parameter_state) {
      throw InvalidArgument(fmt::format("{} is a sharded checkpoint of `strategy` fsdp, which a sharded optimizer "
                                        "cannot take its state from; continue it with `strategy` fsdp, or with a "
                                        "plain optimizer",
                                        path));
    }
    pieces.emplace(path, file.metadata);
    for (const ShardedTensor& tensor : pieces->index().tensors) {
      if (!is_optimizer_state_name(tensor.name)) shapes.emplace_back(tensor.name, tensor.shape);
    }
  }
  for (const auto& [name, tensor] : model_part.tensors) shapes.emplace_back(name, tensor.sizes().vec());
  require_same_model(file, shapes, module, path, state.model_name);
  if (pieces) add_gathered_parameters(*pieces, model_part);
  load_weights(module, model_part, path, /*strict=*/true);
  if (format == StoredFormat::kFirst) {
    restore_first_format_momentum(file, path, module, optimizer, kind);
  } else {
    restore_optimizer(file, path, optimizer, kind, device_of(module));
  }
  if (pieces) fill_parameter_states(*pieces, module, optimizer);
  if (extra) read_extra(file, *extra);
  return state;
}

}  // namespace

void save_checkpoint(const std::string& path, const torch::nn::Module& module, const torch::optim::Optimizer& optimizer,
                     const CheckpointState& state, const ExtraState& extra) {
  write_checkpoint_file(path, module, optimizer_kind(optimizer),
                        {named_state(module), optim::save_optimizer_archive(optimizer), kCheckpointFormat, {}}, state,
                        extra);
}

void save_checkpoint(const std::string& path, const torch::nn::Module& module,
                     const optim::ZeroRedundancyOptimizer& optimizer, const CheckpointState& state,
                     const ExtraState& extra) {
  write_checkpoint_file(path, module, optimizer_kind(optimizer),
                        {named_state(module), optim::save_optimizer_archive(optimizer), kCheckpointFormat, {}}, state,
                        extra);
}

CheckpointState load_checkpoint(const std::string& path, torch::nn::Module& module, torch::optim::Optimizer& optimizer,
                                ExtraState* extra) {
  return load_checkpoint_of_kind(path, module, optimizer, optimizer_kind(optimizer), true, extra);
}

CheckpointState load_checkpoint(const std::string& path, torch::nn::Module& module,
                                optim::ZeroRedundancyOptimizer& optimizer, ExtraState* extra) {
  return load_checkpoint_of_kind(path, module, optimizer, optimizer_kind(optimizer), false, extra);
}

}  // namespace tandem::checkpoint
