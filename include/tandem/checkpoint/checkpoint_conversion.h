#pragma once
// Turning tandem's checkpoints and weights into PyTorch's formats (`tandem convert`): a distributed checkpoint
// (DCP, distributed_checkpoint.h) with the model under `model.` as torchtitan nests it, or Hugging Face's sharded
// safetensors with an index (sharded_safetensors.h). The source is anything `--init` reads: a weights file, a
// tandem checkpoint, full or sharded, a DCP folder, sharded safetensors.
#include <cstdint>
#include <string>

#include "tandem/checkpoint/sharded_safetensors.h"

namespace tandem::checkpoint {

enum class ConversionFormat { kDistributedCheckpoint, kShardedSafetensors };

// "dcp" or "safetensors"; throws InvalidArgument naming both.
ConversionFormat parse_conversion_format(const std::string& name);

// Writes `destination` (a folder that must not exist; it appears whole or not at all). A sharded tandem checkpoint
// becomes a DCP of one `.distcp` per rank file, each written from that file's pieces alone, so the model is never
// gathered; everything else is read whole, one tensor after another in sharded safetensors.
struct ConversionReport {
  int64_t tensors = 0;
  int64_t files = 0;
  uint64_t bytes = 0;  // of tensor data
};
ConversionReport convert_checkpoint(const std::string& source, const std::string& destination,
                                    ConversionFormat format, uint64_t max_shard_bytes = kDefaultMaxShardBytes);

}  // namespace tandem::checkpoint
