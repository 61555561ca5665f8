#pragma once
// Sharded safetensors, as large models are published and as PyTorch's Hugging Face storage writer saves them: a
// folder of `model-0000i-of-0000n.safetensors` files and `model.safetensors.index.json`
//   {"metadata": {"total_size": BYTES}, "weight_map": {"fc1.weight": "model-00001-of-00002.safetensors", ...}}
// and, written by PyTorch's distributed checkpoint per rank, files whose pieces say where they lie in their tensor
// (`DCP_SHARDING_INFO` in the safetensors metadata: {"fc1.weight": {"saved_offsets": [64, 0]}, ...}).
#include <torch/types.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "tandem/checkpoint/safetensors.h"

namespace tandem::checkpoint {

inline constexpr const char* kShardedSafetensorsIndex = "model.safetensors.index.json";
// Hugging Face's writers' default largest file.
inline constexpr uint64_t kDefaultMaxShardBytes = 5'000'000'000;

// Whether `path` is an index file (`*.json`) or a folder holding safetensors files.
bool is_sharded_safetensors(const std::string& path);

// Every tensor whole under its name: through the index where there is one (each tensor from the file it names), else
// from every `*.safetensors` file of the folder; pieces with DCP_SHARDING_INFO put together and checked (inside the
// tensor, none overlapping, all of it covered). A missing file, one the index names that lacks its tensor, a tensor
// in two files or a damaged file throws InvalidArgument in one line naming it.
TensorFile read_sharded_safetensors(const std::string& path);

// Writes `dir` (which must not exist) as Hugging Face does: the tensors in order, a new file whenever the next tensor
// would take one past `max_shard_bytes` (a larger tensor gets a file of its own), and the index. Nothing appears at
// `dir` until every file is written and synced. Returns the number of safetensors files.
size_t write_sharded_safetensors(const std::string& dir, const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                               uint64_t max_shard_bytes = kDefaultMaxShardBytes);

}  // namespace tandem::checkpoint
