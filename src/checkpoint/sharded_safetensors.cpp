// Sharded safetensors (tandem/checkpoint/sharded_safetensors.h).
#include "tandem/checkpoint/sharded_safetensors.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "folder_output.h"
#include "tensor_boxes.h"
#include "tandem/util/atomic_file.h"
#include "tandem/util/error.h"

namespace tandem::checkpoint {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct Piece {
  std::vector<int64_t> offsets;
  torch::Tensor data;
};

// The pieces of each tensor, in the order names were first met, put together at the end: a tensor's whole shape is
// known only once every piece was seen (DCP_SHARDING_INFO gives offsets, not the whole).
class ShardedTensors {
 public:
  explicit ShardedTensors(std::string source) : source_(std::move(source)) {}

  void add_file(const std::string& path, const std::vector<std::string>* only) {
    SafetensorsReader reader(path);
    const auto format = reader.metadata().find("format");
    if (format != reader.metadata().end() && format->second.rfind("tandem-", 0) == 0) {
      throw InvalidArgument(fmt::format("{} is a tandem checkpoint, not a weights file: name the checkpoint "
                                        "file itself rather than its folder", path));
    }
    json sharding = json::object();
    const auto info = reader.metadata().find("DCP_SHARDING_INFO");
    if (info != reader.metadata().end()) {
      sharding = json::parse(info->second, nullptr, false);
      if (!sharding.is_object()) throw InvalidArgument(path + ": its DCP_SHARDING_INFO is not a JSON object (damaged)");
    }
    const auto read = [&](const std::string& name) {
      if (reader.find(name) == nullptr) {
        throw InvalidArgument(fmt::format("{}: has no tensor '{}', which the index places in it (the index or the "
                                          "file is damaged, or they are of different saves)", path, name));
      }
      torch::Tensor data = reader.read(name);
      const auto offsets = sharding.find(name);
      std::vector<int64_t> at(data.dim(), 0);
      if (offsets != sharding.end()) {
        const json& saved = offsets->is_object() ? offsets->value("saved_offsets", json()) : json();
        if (!saved.is_array() || saved.size() != at.size() ||
            !std::all_of(saved.begin(), saved.end(), [](const json& o) { return o.is_number_unsigned(); })) {
          throw InvalidArgument(fmt::format("{}: the DCP_SHARDING_INFO of '{}' is not its {} offsets (damaged)", path,
                                            name, at.size()));
        }
        for (size_t d = 0; d < at.size(); ++d) {
          // Held far below int64's range, so that an offset plus a size cannot overflow.
          if (saved[d].get<uint64_t>() > (uint64_t{1} << 48)) {
            throw InvalidArgument(fmt::format("{}: the DCP_SHARDING_INFO of '{}' places it at an offset no tensor "
                                              "reaches (damaged)", path, name));
          }
          at[d] = saved[d].get<int64_t>();
        }
      } else if (pieces_.count(name) != 0) {
        throw InvalidArgument(fmt::format("{}: holds '{}' whole, which another file holds too", path, name));
      }
      if (pieces_.count(name) == 0) order_.push_back(name);
      pieces_[name].push_back({std::move(at), std::move(data)});
    };
    if (only != nullptr) {
      for (const std::string& name : *only) read(name);
    } else {
      for (const TensorEntry& entry : reader.entries()) read(entry.name);
    }
  }

  TensorFile finish() {
    TensorFile file;
    for (const std::string& name : order_) {
      std::vector<Piece>& pieces = pieces_[name];
      std::vector<int64_t> shape(pieces.front().data.dim(), 0);
      for (const Piece& piece : pieces) {
        if (piece.data.dim() != static_cast<int64_t>(shape.size())) {
          throw InvalidArgument(fmt::format("{}: the pieces of '{}' differ in their number of dimensions (damaged)",
                                            source_, name));
        }
        for (size_t d = 0; d < shape.size(); ++d) shape[d] = std::max(shape[d], piece.offsets[d] + piece.data.size(d));
      }
      // The pieces must hold as many elements as the shape they span before it is allocated: forged offsets
      // would otherwise make a tensor far larger than the files.
      __int128 held = 0, spanned = 1;
      for (const Piece& piece : pieces) held += piece.data.numel();
      for (int64_t d : shape) spanned *= d;
      if (held != spanned) {
        throw InvalidArgument(fmt::format("{}: the pieces of '{}' hold {} elements and span a tensor of {} (a piece is "
                                          "missing, or they overlap)", source_, name, static_cast<int64_t>(held),
                                          static_cast<int64_t>(std::min<__int128>(spanned, INT64_MAX))));
      }
      if (pieces.size() == 1 && std::all_of(pieces[0].offsets.begin(), pieces[0].offsets.end(),
                                            [](int64_t o) { return o == 0; })) {
        file.tensors.emplace_back(name, std::move(pieces[0].data));
        continue;
      }
      TensorAssembly whole(name, shape, pieces.front().data.scalar_type(), source_);
      for (const Piece& piece : pieces) whole.add(piece.offsets, piece.data);
      file.tensors.emplace_back(name, whole.finish());
      pieces.clear();
    }
    return file;
  }

 private:
  std::string source_;
  std::vector<std::string> order_;
  std::map<std::string, std::vector<Piece>> pieces_;
};

std::string file_in(const fs::path& dir, const std::string& name, const std::string& index_path) {
  if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..") {
    throw InvalidArgument(fmt::format("{}: names the file '{}', which is not a file of its folder (the index is "
                                      "damaged)", index_path, name));
  }
  const std::string path = (dir / name).string();
  std::error_code error;
  if (!fs::exists(path, error)) {
    throw InvalidArgument(fmt::format("{}: missing (the index {} names it: the checkpoint is incomplete)", path,
                                      index_path));
  }
  return path;
}

TensorFile read_through_index(const std::string& index_path) {
  std::ifstream in(index_path);
  if (!in) throw InvalidArgument(index_path + ": cannot open it");
  const json index = json::parse(in, nullptr, false);
  const json* map = index.is_object() && index.contains("weight_map") ? &index.at("weight_map") : nullptr;
  if (map == nullptr || !map->is_object()) {
    throw InvalidArgument(index_path + ": not a sharded safetensors index (no \"weight_map\" object of names to files)");
  }
  std::map<std::string, std::vector<std::string>> names_by_file;
  for (const auto& [name, file] : map->items()) {
    if (!file.is_string()) throw InvalidArgument(fmt::format("{}: the file of '{}' is not a string", index_path, name));
    names_by_file[file.get<std::string>()].push_back(name);
  }
  const fs::path dir = fs::path(index_path).parent_path();
  ShardedTensors tensors(index_path);
  for (const auto& [file, names] : names_by_file) tensors.add_file(file_in(dir, file, index_path), &names);
  return tensors.finish();
}

}  // namespace

bool is_sharded_safetensors(const std::string& path) {
  std::error_code error;
  if (fs::is_regular_file(path, error)) return fs::path(path).extension() == ".json";
  if (!fs::is_directory(path, error)) return false;
  for (const auto& entry : fs::directory_iterator(path, error)) {
    if (entry.path().extension() == ".safetensors") return true;
  }
  return false;
}

TensorFile read_sharded_safetensors(const std::string& path) {
  std::error_code error;
  if (fs::is_regular_file(path, error)) return read_through_index(path);
  const fs::path index = fs::path(path) / kShardedSafetensorsIndex;
  if (fs::exists(index, error)) return read_through_index(index.string());
  std::vector<std::string> files;
  for (const auto& entry : fs::directory_iterator(path, error)) {
    if (entry.path().extension() == ".safetensors") files.push_back(entry.path().string());
  }
  if (error) throw Error(fmt::format("{}: cannot list it: {}", path, error.message()));
  std::sort(files.begin(), files.end());
  ShardedTensors tensors(path);
  for (const std::string& file : files) tensors.add_file(file, nullptr);
  return tensors.finish();
}

size_t write_sharded_safetensors(const std::string& dir, const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                               uint64_t max_shard_bytes) {
  TANDEM_CHECK(max_shard_bytes > 0, "a shard size of 0 bytes");
  // Which file each tensor goes to, first: the names hold the number of files.
  std::vector<size_t> shard_of;
  uint64_t in_shard = 0;
  uint64_t total = 0;
  size_t shards = 0;
  for (const auto& [name, tensor] : tensors) {
    const uint64_t bytes = static_cast<uint64_t>(tensor.numel()) * tensor.element_size();
    if (shards == 0 || (in_shard > 0 && in_shard + bytes > max_shard_bytes)) {
      ++shards;
      in_shard = 0;
    }
    in_shard += bytes;
    total += bytes;
    shard_of.push_back(shards - 1);
  }
  FolderOutput folder(dir);
  json weight_map = json::object();
  for (size_t shard = 0; shard < shards; ++shard) {
    const std::string name = fmt::format("model-{:05d}-of-{:05d}.safetensors", shard + 1, shards);
    std::vector<std::pair<std::string, torch::Tensor>> part;
    for (size_t i = 0; i < tensors.size(); ++i) {
      if (shard_of[i] != shard) continue;
      part.push_back(tensors[i]);
      weight_map[tensors[i].first] = name;
    }
    save_safetensors(folder.path(name), part, {{"format", "pt"}});
  }
  const json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  write_file_atomically(folder.path(kShardedSafetensorsIndex), index.dump(2) + "\n");
  folder.publish();
  return shards;
}

}  // namespace tandem::checkpoint
