#pragma once
// A sharded checkpoint (docs/checkpoint.md, "Sharded checkpoints"): `--strategy fsdp --checkpoint-format sharded`
// writes, for RUN_DIR/checkpoint-EEEE-BBBBBBBB.safetensors,
//   checkpoint-EEEE-BBBBBBBB.rank-RRRRR-of-WWWWW.safetensors   one per rank, written by that rank: its pieces of
//       every parameter and of every parameter's per-element optimizer state (the parts its shards cover), each
//       an entry named as the tensor, flattened, with crc32c checksums as every checkpoint file has;
//   checkpoint-EEEE-BBBBBBBB.index.json   written by rank 0: every tensor's name, shape, dtype, unit and pieces;
//   checkpoint-EEEE-BBBBBBBB.safetensors  written by rank 0 last, by the full checkpoint's code: the buffers, the
//       optimizer's archive with its scalars only (Adam's step), the state fields, the generators, the user's extra
//       state, and the index's name and checksum. Its format is kShardedCheckpointFormat.
// The last file is the checkpoint as the run dir lists it: it appears (atomically) only once every other part is
// in place, so a checkpoint is complete or absent, and the newest-intact rule (train/run_directory.h) applies to
// it whole. This header holds what needs no fsdp: the index, the names, and reading pieces back; writing and
// cutting shards is fsdp_sharded_state.h's.
#include <torch/types.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tandem/train/safetensors.h"

namespace tandem::train {

inline constexpr const char* kShardedCheckpointFormat = "tandem-sharded-checkpoint-1";

// Elements [tensor_begin, tensor_end) of a tensor (row-major), held flat by `file`'s entry of the tensor's name;
// they lie at [unit_begin, unit_end) of the unit's flat vector.
struct ShardPiece {
  std::string file;
  int64_t tensor_begin = 0, tensor_end = 0;
  int64_t unit_begin = 0, unit_end = 0;
};

struct ShardedTensor {
  std::string name;  // a parameter's state-dict name, or optimizer_state_name()'s
  std::vector<int64_t> shape;
  std::string dtype;  // safetensors' spelling: F32
  std::string unit;   // the fsdp unit whose flat vector holds it ("" for the root unit)
  std::vector<ShardPiece> pieces;
};

struct ShardedUnit {
  std::string name;
  int64_t numel = 0;
  int64_t padded_numel = 0;  // a multiple of the world size; each rank's shard is padded_numel / world_size
};

struct ShardedIndex {
  int world_size = 1;
  std::vector<std::string> files;  // by rank
  std::vector<ShardedUnit> units;
  std::vector<ShardedTensor> tensors;
  const ShardedTensor* find(const std::string& name) const;
};

// The name under which a parameter's per-element optimizer state is stored, PyTorch's state_dict path:
// optimizer.state.<parameter>.<field> (field: exp_avg, momentum_buffer...).
std::string optimizer_state_name(const std::string& parameter, const std::string& field);
bool is_optimizer_state_name(const std::string& name);

// The file names (no folder) of the parts of the checkpoint at `checkpoint_path`.
std::string shard_file_name(const std::string& checkpoint_path, int rank, int world_size);
std::string index_file_name(const std::string& checkpoint_path);

// Writes `rank`'s file, checksummed, atomically.
void write_shard_file(const std::string& checkpoint_path, int rank, int world_size,
                      const std::vector<std::pair<std::string, torch::Tensor>>& pieces);
// Writes the index atomically; returns the metadata the main file records it by (its name and checksum).
std::map<std::string, std::string> write_index(const std::string& checkpoint_path, const ShardedIndex& index);

// The parts of a sharded checkpoint, read on demand: the index, checked against the checksum the main file
// (`metadata`) records and for pieces that tile every tensor, and the rank files, opened when a piece of theirs
// is first read. A missing or damaged part (an index whose pieces overlap or leave a gap among them) throws
// InvalidArgument in one line naming that file (and what to do); a part that exists but cannot be opened (too
// many open files, no permission) throws Error, which is not damage.
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
  // A rank file, opened and its header checked; throws (throw_unusable) when it is missing or damaged.
  std::unique_ptr<SafetensorsReader> open_checked(const std::string& file) const;
  // The same, kept among the kMaxOpenFiles most recently read: a rank of a world far smaller than the one that
  // wrote the checkpoint reads pieces of many files, and must not run out of descriptors.
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

// Whether the file at `checkpoint_path` is the main file of a sharded checkpoint (false when it cannot be read).
bool is_sharded_checkpoint(const std::string& checkpoint_path);

// The parts other than the main file (index, rank files, their temp files) that lie beside the checkpoint at
// `checkpoint_path`, as paths.
std::vector<std::string> sharded_checkpoint_parts(const std::string& checkpoint_path);
// The main file's name that `name` (a file name) is a part of, or "" if it is none.
std::string checkpoint_of_part(const std::string& name);

}  // namespace tandem::train
