// Importing weights (`--init`): from a weights file or sharded safetensors as they are, from a checkpoint (tandem's
// or PyTorch's distributed one) its model alone.
#include <algorithm>

#include "checkpoint_file.h"
#include "file_damage.h"
#include "sharded_gather.h"
#include "tandem/checkpoint/checkpoint_format.h"
#include "tandem/checkpoint/distributed_checkpoint.h"
#include "tandem/checkpoint/sharded_safetensors.h"
#include "tandem/checkpoint/weights.h"
#include "tandem/util/error.h"

namespace tandem::checkpoint {

namespace {

constexpr const char* kDcpModel = "model.";
constexpr const char* kDcpOptimizer = "optimizer.";

bool has_prefix(const std::string& text, const char* prefix) { return text.rfind(prefix, 0) == 0; }

// A DCP saved as torchtitan saves it, {"model": ..., "optimizer": ...}, has every name under one of the two; its
// model is the first, under the model's own names. Any other DCP is a state dict of its own.
TensorFile distributed_checkpoint_model(const std::string& dir) {
  TensorFile file = read_distributed_checkpoint(dir);
  const auto& tensors = file.tensors;
  const bool nested = std::any_of(tensors.begin(), tensors.end(), [](const auto& t) { return has_prefix(t.first, kDcpModel); }) &&
                      std::all_of(tensors.begin(), tensors.end(), [](const auto& t) {
                        return has_prefix(t.first, kDcpModel) || has_prefix(t.first, kDcpOptimizer);
                      });
  if (!nested) return file;
  TensorFile model;
  for (auto& [name, tensor] : file.tensors) {
    if (has_prefix(name, kDcpModel)) model.tensors.emplace_back(name.substr(std::string(kDcpModel).size()), tensor);
  }
  return model;
}

}  // namespace

TensorFile read_model_weights(const std::string& path) {
  if (is_distributed_checkpoint(path)) return distributed_checkpoint_model(path);
  if (is_sharded_safetensors(path)) return read_sharded_safetensors(path);
  TensorFile file = load_safetensors(path);
  const StoredFormat format = stored_format(file.metadata);
  if (format == StoredFormat::kWeights) return file;
  const std::string damage = file_damage(file, path, /*parts=*/true);
  if (!damage.empty()) throw InvalidArgument(damage + "; start from an intact checkpoint or weights file");
  TensorFile weights = stored_model_tensors(file);
  if (format == StoredFormat::kSharded) {
    ShardedCheckpointReader pieces(path, file.metadata);
    add_gathered_parameters(pieces, weights);
  }
  return weights;
}

}  // namespace tandem::checkpoint
