// Importing weights (`--init`): from a weights file as they are, from a checkpoint its model alone.
#include "checkpoint_file.h"
#include "file_damage.h"
#include "sharded_gather.h"
#include "tandem/checkpoint/checkpoint_format.h"
#include "tandem/checkpoint/weights.h"
#include "tandem/util/error.h"

namespace tandem::checkpoint {

TensorFile read_model_weights(const std::string& path) {
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
