#include "shard_file.h"

#include <fmt/format.h>

#include <filesystem>

#include "checksummed_file.h"
#include "sharded_index.h"
#include "tandem/util/error.h"
#include "unusable_checkpoint.h"

namespace tandem::checkpoint {
namespace {

constexpr const char* kShardFileFormat = "tandem-checkpoint-shard-1";

std::string file_name_of(const std::string& path) { return std::filesystem::path(path).filename().string(); }

}  // namespace

void write_shard_file(const std::string& checkpoint_path, int rank, int world_size,
                      const std::vector<std::pair<std::string, torch::Tensor>>& pieces) {
  save_checksummed(folder_of_checkpoint(checkpoint_path) + "/" + shard_file_name(checkpoint_path, rank, world_size),
                   pieces,
                   {{"format", kShardFileFormat},
                    {"checkpoint", file_name_of(checkpoint_path)},
                    {"rank", std::to_string(rank)},
                    {"world_size", std::to_string(world_size)}});
}

std::unique_ptr<SafetensorsReader> open_shard_file(const std::string& file, const std::string& checkpoint_path) {
  const std::string path = folder_of_checkpoint(checkpoint_path) + "/" + file;
  std::unique_ptr<SafetensorsReader> reader;
  try {
    reader = std::make_unique<SafetensorsReader>(path);
  } catch (const InvalidArgument& unreadable) {  // missing, cut short, not safetensors
    throw_unusable(fmt::format("{} (a shard file of {})", unreadable.what(), checkpoint_path), checkpoint_path);
  }
  std::string damage = header_damage(reader->entries(), reader->metadata(), path);
  const auto meta = [&](const std::string& key) {
    auto it = reader->metadata().find(key);
    return it == reader->metadata().end() ? std::string() : it->second;
  };
  if (damage.empty() && (meta("format") != kShardFileFormat || meta("checkpoint") != file_name_of(checkpoint_path))) {
    damage = fmt::format("{}: not a shard file of {}", path, checkpoint_path);
  }
  if (!damage.empty()) throw_unusable(damage, checkpoint_path);
  return reader;
}

}  // namespace tandem::checkpoint
