#pragma once
// The checksums every file of a checkpoint carries (docs/checkpoint.md, "Checksums"): crc32c.<entry> of each
// entry's bytes and crc32c.__header__ of everything else in the header, in its metadata. Internal to checkpoint/.
#include <torch/types.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "tandem/checkpoint/safetensors.h"

namespace tandem::checkpoint {

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

// Adds crc32c.<entry> for every tensor's bytes and crc32c.__header__ to `metadata` and writes `path` atomically.
void save_checksummed(const std::string& path, const NamedTensors& tensors, std::map<std::string, std::string> metadata);
// What is wrong with a checksummed file's header (its entries' names, dtypes and shapes, and its metadata), or
// with one entry's bytes: one line naming `path` (and the entry), or "".
std::string header_damage(const std::vector<TensorEntry>& entries, const std::map<std::string, std::string>& metadata,
                          const std::string& path);
std::string entry_damage(const std::string& name, const torch::Tensor& bytes,
                         const std::map<std::string, std::string>& metadata, const std::string& path);
std::vector<TensorEntry> entries_of(const NamedTensors& tensors);

}  // namespace tandem::checkpoint
