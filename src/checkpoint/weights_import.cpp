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

// A DCP saved as torchtitan saves it, {"model": ..., "optimizer": ...}: its model under the model's own names, by
// the nesting its metadata records. Without that record (another saver), a DCP whose every name is under `model.`
// or `optimizer.` is taken for one. Any other DCP is a state dict of its own. The optimizer's state is not read.
TensorFile distributed_checkpoint_model(const std::string& dir) {
  TensorFile file = read_distributed_checkpoint(dir, [](const std::string& name) { return !has_prefix(name, kDcpOptimizer); });
  const std::string model_path = "model/";
  bool recorded = false;
  TensorFile model;
  for (auto& [name, tensor] : file.tensors) {
    const auto nested = file.metadata.find(kNestedNamePrefix + name);
    if (nested == file.metadata.end()) continue;
    recorded = true;
    if (has_prefix(nested->second, model_path.c_str()) && nested->second.find('/', model_path.size()) == std::string::npos) {
      model.tensors.emplace_back(nested->second.substr(model_path.size()), tensor);
    }
  }
  if (recorded) return model;
  const bool nested = !file.tensors.empty() && std::all_of(file.tensors.begin(), file.tensors.end(), [](const auto& t) {
    return has_prefix(t.first, kDcpModel);
  });
  if (!nested) return file;
  for (auto& [name, tensor] : file.tensors) model.tensors.emplace_back(name.substr(std::string(kDcpModel).size()), tensor);
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
