#pragma once
// Reading a sharded checkpoint's pieces back (sharded_index.h has the layout), on any world size: a rank reads
// only the pieces it needs, and the run dir's search checks every part one file at a time. Internal to
// checkpoint/.
#include <torch/types.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "sharded_index.h"
#include "tandem/checkpoint/safetensors.h"

namespace tandem::checkpoint {

// The parts of a sharded checkpoint, read on demand: the index (read_index), and the rank files, opened when a
// piece of theirs is first read. A missing or damaged part throws InvalidArgument in one line naming that file
// (and what to do); a part that exists but cannot be opened (too many open files, no permission) throws Error,
// which is not damage.
class ShardedCheckpointReader {
 public:
  ShardedCheckpointReader(const std::string& checkpoint_path, const std::map<std::string, std::string>& metadata);
  ~ShardedCheckpointReader();

  const ShardedIndex& index() const { return index_; }
  // Elements [begin, end) of tensor `name`, flat, from the pieces that overlap them; each piece read is checked
  // against its checksum. Holds only those pieces.
  torch::Tensor read_range(const std::string& name, int64_t begin, int64_t end);
  torch::Tensor read_whole(const std::string& name);  // in its shape
  // What is wrong with the rank files (missing, cut short, a checksum that fails, a piece the index names that
  // they lack), reading one entry at a time and holding one file open at a time; "" when nothing. A file that
  // exists but cannot be opened (too many open files) throws Error: that is not damage.
  std::string damage();

 private:
  // A rank file (open_shard_file's), kept among the kMaxOpenFiles most recently read: a rank of a world far
  // smaller than the one that wrote the checkpoint reads pieces of many files, and must not run out of
  // descriptors.
  SafetensorsReader& open(const std::string& file);

  static constexpr size_t kMaxOpenFiles = 8;
  std::string checkpoint_path_, folder_;
  ShardedIndex index_;
  std::vector<std::pair<std::string, std::unique_ptr<SafetensorsReader>>> open_files_;  // most recently used first
};

// What ShardedCheckpointReader::damage() finds, or what is wrong with the index that `metadata` (the checkpoint
// file's) names: one line naming the file, without advice; "" when nothing is.
std::string sharded_checkpoint_damage(const std::string& checkpoint_path,
                                      const std::map<std::string, std::string>& metadata);

}  // namespace tandem::checkpoint
