#include "sharded_checkpoint_reader.h"

#include <fmt/format.h>

#include <algorithm>

#include "checksummed_file.h"
#include "shard_file.h"
#include "tandem/util/error.h"
#include "unusable_checkpoint.h"

namespace tandem::checkpoint {

ShardedCheckpointReader::ShardedCheckpointReader(const std::string& checkpoint_path,
                                                 const std::map<std::string, std::string>& metadata)
    : checkpoint_path_(checkpoint_path),
      folder_(folder_of_checkpoint(checkpoint_path)),
      index_(read_index(checkpoint_path, metadata)) {}

ShardedCheckpointReader::~ShardedCheckpointReader() = default;

SafetensorsReader& ShardedCheckpointReader::open(const std::string& file) {
  const auto found = std::find_if(open_files_.begin(), open_files_.end(),
                                  [&](const auto& open) { return open.first == file; });
  if (found != open_files_.end()) {
    std::rotate(open_files_.begin(), found, found + 1);  // the most recently used first
    return *open_files_.front().second;
  }
  if (open_files_.size() >= kMaxOpenFiles) open_files_.pop_back();
  open_files_.emplace(open_files_.begin(), file, open_shard_file(file, checkpoint_path_));
  return *open_files_.front().second;
}

torch::Tensor ShardedCheckpointReader::read_range(const std::string& name, int64_t begin, int64_t end) {
  const ShardedTensor* tensor = index_.find(name);
  if (!tensor) throw_unusable(fmt::format("{}: its index has no tensor '{}'", checkpoint_path_, name), checkpoint_path_);
  torch::Tensor out;
  int64_t covered = 0;
  for (const ShardPiece& piece : tensor->pieces) {
    const int64_t from = std::max(begin, piece.tensor_begin), to = std::min(end, piece.tensor_end);
    if (from >= to) continue;
    SafetensorsReader& file = open(piece.file);
    const TensorEntry* entry = file.find(name);
    const int64_t numel = piece.tensor_end - piece.tensor_begin;
    if (!entry || entry->shape != std::vector<int64_t>{numel}) {
      throw_unusable(fmt::format("{}: lacks the piece [{}, {}) of '{}' that the index of {} names", file.path(),
                                 piece.tensor_begin, piece.tensor_end, name, checkpoint_path_),
                     checkpoint_path_);
    }
    const torch::Tensor bytes = file.read(name);
    const std::string damage = entry_damage(name, bytes, file.metadata(), file.path());
    if (!damage.empty()) throw_unusable(damage, checkpoint_path_);
    if (!out.defined()) out = torch::empty({end - begin}, bytes.options());
    out.narrow(0, from - begin, to - from).copy_(bytes.narrow(0, from - piece.tensor_begin, to - from));
    covered += to - from;
  }
  if (covered != end - begin) {
    throw_unusable(fmt::format("{}: the pieces its index names for '{}' do not cover elements [{}, {})",
                               checkpoint_path_, name, begin, end),
                   checkpoint_path_);
  }
  return out.defined() ? out : torch::empty({0});
}

torch::Tensor ShardedCheckpointReader::read_whole(const std::string& name) {
  const ShardedTensor* tensor = index_.find(name);
  if (!tensor) throw_unusable(fmt::format("{}: its index has no tensor '{}'", checkpoint_path_, name), checkpoint_path_);
  int64_t numel = 1;
  for (int64_t extent : tensor->shape) numel *= extent;
  return read_range(name, 0, numel).view(tensor->shape);
}

std::string ShardedCheckpointReader::damage() {
  // The pieces each file must hold, by file, so that every file is opened once and closed before the next.
  std::map<std::string, std::vector<std::pair<const ShardedTensor*, const ShardPiece*>>> pieces_of;
  for (const ShardedTensor& tensor : index_.tensors) {
    for (const ShardPiece& piece : tensor.pieces) pieces_of[piece.file].emplace_back(&tensor, &piece);
  }
  try {
    for (const std::string& file : index_.files) {
      const std::unique_ptr<SafetensorsReader> reader = open_shard_file(file, checkpoint_path_);
      for (const TensorEntry& entry : reader->entries()) {
        const std::string damage = entry_damage(entry.name, reader->read(entry.name), reader->metadata(), reader->path());
        if (!damage.empty()) return damage;
      }
      for (const auto& [tensor, piece] : pieces_of[file]) {
        const TensorEntry* entry = reader->find(tensor->name);
        if (!entry || entry->shape != std::vector<int64_t>{piece->tensor_end - piece->tensor_begin}) {
          return fmt::format("{}/{}: lacks the piece of '{}' that the index of {} names", folder_, file, tensor->name,
                             checkpoint_path_);
        }
      }
    }
  } catch (const InvalidArgument& unusable) {
    return without_advice(unusable.what());
  }
  return "";
}

std::string sharded_checkpoint_damage(const std::string& checkpoint_path,
                                      const std::map<std::string, std::string>& metadata) {
  try {
    return ShardedCheckpointReader(checkpoint_path, metadata).damage();
  } catch (const InvalidArgument& unusable) {  // the index missing or damaged
    return without_advice(unusable.what());
  }
}

}  // namespace tandem::checkpoint
