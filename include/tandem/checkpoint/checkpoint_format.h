#pragma once
// The formats of tandem's checkpoint files (docs/checkpoint.md), each named by the "format" value of a file's
// metadata: the format a run writes (LoopOptions::checkpoint_format, `tandem train --checkpoint-format`), and the
// one question every reader asks first, which format a file holds.
#include <map>
#include <optional>
#include <string>

#include "tandem/util/error.h"

namespace tandem::checkpoint {

inline constexpr const char* kCheckpointFormat = "tandem-checkpoint-3";
inline constexpr const char* kShardedCheckpointFormat = "tandem-sharded-checkpoint-1";
// The formats before checksums, which still load (unverified).
inline constexpr const char* kFirstCheckpointFormat = "tandem-checkpoint-1";
inline constexpr const char* kSecondCheckpointFormat = "tandem-checkpoint-2";

// What a run writes (LoopOptions::checkpoint_format). kFull: the whole state in one file, written by rank 0 (fsdp
// gathers it on every rank first). kSharded (fsdp only): each rank writes its shards' pieces to a file of its own
// and rank 0 an index of them, so no rank gathers the model; it continues on any world size, under fsdp or
// (gathered whole on each rank) ddp with a plain optimizer. A run continues either kind, whatever it writes.
enum class CheckpointFormat { kFull, kSharded };

inline std::string to_string(CheckpointFormat format) {
  return format == CheckpointFormat::kSharded ? "sharded" : "full";
}

// Throws InvalidArgument naming the two spellings.
inline CheckpointFormat parse_checkpoint_format(const std::string& name) {
  for (CheckpointFormat format : {CheckpointFormat::kFull, CheckpointFormat::kSharded}) {
    if (name == to_string(format)) return format;
  }
  throw InvalidArgument("checkpoint format '" + name + "' is not one of full, sharded");
}

// What a safetensors file holds, by its metadata.
enum class StoredFormat {
  kWeights,  // no tandem checkpoint: a weights file (--save-weights, PyTorch's, Hugging Face's), or anything else
  kFirst,    // tandem-checkpoint-1: SGD momentum by parameter name, no checksums
  kSecond,   // tandem-checkpoint-2: the optimizer's archive, no checksums
  kFull,     // kCheckpointFormat
  kSharded,  // kShardedCheckpointFormat: the main file of a sharded checkpoint
};

// Whether files of `format` carry the crc32c checksums that every check before a restore reads.
inline bool has_checksums(StoredFormat format) {
  return format == StoredFormat::kFull || format == StoredFormat::kSharded;
}

// The format of a file whose metadata is `metadata`.
StoredFormat stored_format(const std::map<std::string, std::string>& metadata);
// The same, reading only the header of the file at `path`; nullopt when it cannot be read (whoever loads it says
// what is wrong).
std::optional<StoredFormat> stored_format(const std::string& path);

}  // namespace tandem::checkpoint
