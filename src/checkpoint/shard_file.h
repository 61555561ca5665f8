#pragma once
// A sharded checkpoint's rank file (sharded_index.h has the layout): one rank's pieces, each an entry named as its
// tensor, flattened and checksummed. Internal to checkpoint/.
#include <torch/types.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tandem/checkpoint/safetensors.h"

namespace tandem::checkpoint {

// Writes `rank`'s file, checksummed, atomically.
void write_shard_file(const std::string& checkpoint_path, int rank, int world_size,
                      const std::vector<std::pair<std::string, torch::Tensor>>& pieces);

// The rank file `file` (a name beside the checkpoint at `checkpoint_path`), opened and its header checked: that
// it matches its checksum and is a shard file of that checkpoint. Throws (throw_unusable) when it is missing or
// damaged, Error when it exists but cannot be opened.
std::unique_ptr<SafetensorsReader> open_shard_file(const std::string& file, const std::string& checkpoint_path);

}  // namespace tandem::checkpoint
