#pragma once
// A sharded checkpoint (docs/checkpoint.md, "Sharded checkpoints"): `--strategy fsdp --checkpoint-format sharded`
// writes, for RUN_DIR/checkpoint-EEEE-BBBBBBBB.safetensors,
//   checkpoint-EEEE-BBBBBBBB.rank-RRRRR-of-WWWWW.safetensors   one per rank, written by that rank: its pieces of
//       every parameter and of every parameter's per-element optimizer state (the parts its shards cover), each
//       an entry named as the tensor, flattened, with crc32c checksums as every checkpoint file has (shard_file.h);
//   checkpoint-EEEE-BBBBBBBB.index.json   written by rank 0: every tensor's name, shape, dtype, unit and pieces;
//   checkpoint-EEEE-BBBBBBBB.safetensors  written by rank 0 last, by the full checkpoint's code: the buffers, the
//       optimizer's archive with its scalars only (Adam's step), the state fields, the generators, the user's extra
//       state, and the index's name and checksum. Its format is kShardedCheckpointFormat.
// The last file is the checkpoint as the run dir lists it: it appears (atomically) only once every other part is
// in place, so a checkpoint is complete or absent, and the newest-intact rule (checkpoint/checkpoint_folder.h)
// applies to it whole. This header holds the index and the names of the parts; reading pieces back is
// sharded_checkpoint_reader.h's, cutting fsdp's shards into pieces fsdp_sharded_checkpoint.h's. Internal to
// checkpoint/.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace tandem::checkpoint {

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
// The main file's name that `name` (a file name) is a part of, or "" if it is none.
std::string checkpoint_of_part(const std::string& name);
// The folder the checkpoint at `checkpoint_path` and its parts lie in ("." for none).
std::string folder_of_checkpoint(const std::string& checkpoint_path);

// Writes the index atomically; returns the metadata the main file records it by (its name and checksum).
std::map<std::string, std::string> write_index(const std::string& checkpoint_path, const ShardedIndex& index);
// The index that `metadata` (the main file's) names, checked against the checksum it records and for pieces that
// tile every tensor. A missing or damaged index (pieces that overlap or leave a gap among them) throws
// InvalidArgument (throw_unusable) in one line naming it; one that exists but cannot be opened (too many open
// files, no permission) throws Error, which is not damage.
ShardedIndex read_index(const std::string& checkpoint_path, const std::map<std::string, std::string>& metadata);

}  // namespace tandem::checkpoint
