#include "tandem/checkpoint/checkpoint_format.h"

#include "tandem/checkpoint/safetensors.h"

namespace tandem::checkpoint {

StoredFormat stored_format(const std::map<std::string, std::string>& metadata) {
  const auto found = metadata.find("format");
  if (found == metadata.end()) return StoredFormat::kWeights;
  const std::string& format = found->second;
  if (format == kCheckpointFormat) return StoredFormat::kFull;
  if (format == kShardedCheckpointFormat) return StoredFormat::kSharded;
  if (format == kSecondCheckpointFormat) return StoredFormat::kSecond;
  if (format == kFirstCheckpointFormat) return StoredFormat::kFirst;
  return StoredFormat::kWeights;
}

std::optional<StoredFormat> stored_format(const std::string& path) {
  try {
    return stored_format(SafetensorsReader(path).metadata());
  } catch (const InvalidArgument&) {  // unreadable: whoever loads it says what is wrong
    return std::nullopt;
  }
}

}  // namespace tandem::checkpoint
