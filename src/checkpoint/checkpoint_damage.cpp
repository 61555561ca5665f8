#include "tandem/checkpoint/checkpoint_damage.h"

#include "checksummed_file.h"
#include "file_damage.h"
#include "sharded_checkpoint_reader.h"
#include "tandem/checkpoint/checkpoint_format.h"
#include "tandem/util/error.h"

namespace tandem::checkpoint {

std::string file_damage(const TensorFile& file, const std::string& path, bool parts) {
  const StoredFormat format = stored_format(file.metadata);
  if (format == StoredFormat::kFirst || format == StoredFormat::kSecond) return "";
  if (format == StoredFormat::kWeights) {
    return path + ": not a tandem checkpoint (expected metadata format=" + kCheckpointFormat + ")";
  }
  std::string damage = header_damage(entries_of(file.tensors), file.metadata, path);
  for (const auto& [name, tensor] : file.tensors) {
    if (damage.empty()) damage = entry_damage(name, tensor, file.metadata, path);
  }
  if (parts && damage.empty() && format == StoredFormat::kSharded) {
    damage = sharded_checkpoint_damage(path, file.metadata);
  }
  return damage;
}

std::string checkpoint_damage(const std::string& path) {
  try {
    return file_damage(load_safetensors(path), path, /*parts=*/true);
  } catch (const InvalidArgument& unreadable) {  // truncated, or not safetensors at all
    return unreadable.what();
  }
}

}  // namespace tandem::checkpoint
