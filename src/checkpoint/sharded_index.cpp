#include "sharded_index.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <stdexcept>

#include "tandem/monitor/crc32c.h"
#include "tandem/util/atomic_file.h"
#include "tandem/util/error.h"
#include "tandem/util/file_read_log.h"
#include "unusable_checkpoint.h"

namespace tandem::checkpoint {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kIndexFormat = "tandem-sharded-index-1";
constexpr const char* kOptimizerStatePrefix = "optimizer.state.";
// What the main file records the index by.
constexpr const char* kIndexName = "sharded_index";
constexpr const char* kIndexChecksum = "sharded_index_crc32c";

std::string stem_of(const std::string& checkpoint_path) {
  const std::string name = fs::path(checkpoint_path).filename().string();
  return name.substr(0, name.find('.'));
}

std::string index_checksum(const std::string& text) { return fmt::format("{:08x}", monitor::crc32c(text)); }

// The parts of a checkpoint lie beside it: a name with a folder in it is not one tandem wrote.
void require_file_name(const std::string& name) {
  if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..") {
    throw std::runtime_error("not a file name");
  }
}

ShardedIndex parse_index(const std::string& text) {
  const json j = json::parse(text);
  if (j.at("format").get<std::string>() != kIndexFormat) throw std::runtime_error("another format");
  ShardedIndex index;
  index.world_size = j.at("world_size").get<int>();
  index.files = j.at("files").get<std::vector<std::string>>();
  for (const json& unit : j.at("units")) {
    index.units.push_back({unit.at("name").get<std::string>(), unit.at("numel").get<int64_t>(),
                           unit.at("padded_numel").get<int64_t>()});
  }
  for (const json& tensor : j.at("tensors")) {
    ShardedTensor t{tensor.at("name").get<std::string>(), tensor.at("shape").get<std::vector<int64_t>>(),
                    tensor.at("dtype").get<std::string>(), tensor.at("unit").get<std::string>(), {}};
    for (const json& piece : tensor.at("pieces")) {
      const json& in_tensor = piece.at("tensor_range");
      const json& in_unit = piece.at("unit_range");
      t.pieces.push_back({piece.at("file").get<std::string>(), in_tensor.at(0).get<int64_t>(),
                          in_tensor.at(1).get<int64_t>(), in_unit.at(0).get<int64_t>(), in_unit.at(1).get<int64_t>()});
    }
    index.tensors.push_back(std::move(t));
  }
  for (const std::string& file : index.files) require_file_name(file);
  return index;
}

// What makes `index` unusable although it parsed: pieces that overlap, leave a gap or lie outside their tensor or
// unit, which would leave elements of a tensor unread (uninitialised memory in the model) or read twice; "" when
// nothing does.
std::string index_inconsistency(const ShardedIndex& index) {
  if (index.world_size < 1 || index.files.size() != static_cast<size_t>(index.world_size)) {
    return fmt::format("it names {} rank files for world size {}", index.files.size(), index.world_size);
  }
  std::map<std::string, int64_t> unit_numel;
  for (const ShardedUnit& unit : index.units) {
    if (unit.numel < 0 || unit.padded_numel < unit.numel || unit.padded_numel % index.world_size != 0) {
      return fmt::format("unit '{}' has {} elements, padded to {}, which {} ranks cannot share", unit.name, unit.numel,
                         unit.padded_numel, index.world_size);
    }
    unit_numel[unit.name] = unit.numel;
  }
  const std::set<std::string> files(index.files.begin(), index.files.end());
  for (const ShardedTensor& tensor : index.tensors) {
    int64_t numel = 1;
    for (int64_t extent : tensor.shape) {
      if (extent < 0 || (extent > 0 && numel > std::numeric_limits<int64_t>::max() / extent)) {
        return fmt::format("tensor '{}' has the shape [{}]", tensor.name, fmt::join(tensor.shape, ", "));
      }
      numel *= extent;
    }
    const auto unit = unit_numel.find(tensor.unit);
    if (unit == unit_numel.end()) return fmt::format("tensor '{}' lies in a unit it does not list", tensor.name);
    // The pieces tile the tensor in order: each begins where the one before ended, the last ends at its end.
    int64_t next = 0;
    for (const ShardPiece& piece : tensor.pieces) {
      const int64_t length = piece.tensor_end - piece.tensor_begin;
      if (piece.tensor_begin != next || length <= 0 || piece.tensor_end > numel || piece.unit_begin < 0 ||
          piece.unit_end - piece.unit_begin != length || piece.unit_end > unit->second) {
        return fmt::format("the piece [{}, {}) of '{}' (at [{}, {}) of its unit) overlaps another, leaves a gap or "
                           "lies outside the tensor's {} elements or its unit's {}",
                           piece.tensor_begin, piece.tensor_end, tensor.name, piece.unit_begin, piece.unit_end, numel,
                           unit->second);
      }
      if (!files.count(piece.file)) {
        return fmt::format("a piece of '{}' lies in {}, which is not one of its rank files", tensor.name, piece.file);
      }
      next = piece.tensor_end;
    }
    if (next != numel) {
      return fmt::format("the pieces of '{}' cover its elements [0, {}) of {}", tensor.name, next, numel);
    }
  }
  return "";
}

}  // namespace

const ShardedTensor* ShardedIndex::find(const std::string& name) const {
  for (const ShardedTensor& tensor : tensors) {
    if (tensor.name == name) return &tensor;
  }
  return nullptr;
}

std::string optimizer_state_name(const std::string& parameter, const std::string& field) {
  return kOptimizerStatePrefix + parameter + "." + field;
}

bool is_optimizer_state_name(const std::string& name) { return name.rfind(kOptimizerStatePrefix, 0) == 0; }

std::string shard_file_name(const std::string& checkpoint_path, int rank, int world_size) {
  return fmt::format("{}.rank-{:05d}-of-{:05d}.safetensors", stem_of(checkpoint_path), rank, world_size);
}

std::string index_file_name(const std::string& checkpoint_path) { return stem_of(checkpoint_path) + ".index.json"; }

std::string checkpoint_of_part(const std::string& name) {
  const size_t dot = name.find('.');
  if (name.rfind("checkpoint-", 0) != 0 || dot == std::string::npos) return "";
  const std::string rest = name.substr(dot + 1);
  const auto ends_with = [&](const std::string& tail) {
    return rest.size() >= tail.size() && rest.compare(rest.size() - tail.size(), tail.size(), tail) == 0;
  };
  if (ends_with(".damaged")) return "";  // set aside for a look, with its checkpoint
  if (rest.rfind("rank-", 0) != 0 && rest.rfind("index.json", 0) != 0) return "";
  return name.substr(0, dot) + ".safetensors";
}

std::string folder_of_checkpoint(const std::string& checkpoint_path) {
  const fs::path folder = fs::path(checkpoint_path).parent_path();
  return folder.empty() ? "." : folder.string();
}

std::map<std::string, std::string> write_index(const std::string& checkpoint_path, const ShardedIndex& index) {
  json units = json::array(), tensors = json::array();
  for (const ShardedUnit& unit : index.units) {
    units.push_back({{"name", unit.name}, {"numel", unit.numel}, {"padded_numel", unit.padded_numel}});
  }
  for (const ShardedTensor& tensor : index.tensors) {
    json pieces = json::array();
    for (const ShardPiece& piece : tensor.pieces) {
      pieces.push_back({{"file", piece.file},
                        {"tensor_range", {piece.tensor_begin, piece.tensor_end}},
                        {"unit_range", {piece.unit_begin, piece.unit_end}}});
    }
    tensors.push_back({{"name", tensor.name},
                       {"shape", tensor.shape},
                       {"dtype", tensor.dtype},
                       {"unit", tensor.unit},
                       {"pieces", std::move(pieces)}});
  }
  const json j = {{"format", kIndexFormat},
                  {"checkpoint", fs::path(checkpoint_path).filename().string()},
                  {"world_size", index.world_size},
                  {"files", index.files},
                  {"units", std::move(units)},
                  {"tensors", std::move(tensors)}};
  const std::string text = j.dump(1) + "\n";
  const std::string name = index_file_name(checkpoint_path);
  write_file_atomically(folder_of_checkpoint(checkpoint_path) + "/" + name, text);
  return {{kIndexName, name}, {kIndexChecksum, index_checksum(text)}};
}

ShardedIndex read_index(const std::string& checkpoint_path, const std::map<std::string, std::string>& metadata) {
  const auto name = metadata.find(kIndexName);
  const auto checksum = metadata.find(kIndexChecksum);
  if (name == metadata.end() || checksum == metadata.end()) {
    throw_unusable(checkpoint_path + ": a sharded checkpoint whose metadata does not name its index", checkpoint_path);
  }
  if (name->second.find('/') != std::string::npos) {
    throw_unusable(checkpoint_path + ": its metadata names an index outside its folder", checkpoint_path);
  }
  const std::string path = folder_of_checkpoint(checkpoint_path) + "/" + name->second;
  std::ifstream in(path, std::ios::binary);
  if (!in.is_open()) {
    const int error = errno;
    // As SafetensorsReader: only a missing index is a damaged checkpoint.
    if (error != ENOENT && error != ENOTDIR) {
      throw Error(fmt::format("{}, the index of {}, cannot be opened: {} (which says nothing of its contents: it is "
                              "not treated as damaged)",
                              path, checkpoint_path, std::strerror(error)));
    }
    throw_unusable(path + ", the index of " + checkpoint_path + ", cannot be read", checkpoint_path);
  }
  FileReadLog::note_open(path);
  std::stringstream text;
  text << in.rdbuf();
  if (!in) throw_unusable(path + ", the index of " + checkpoint_path + ", cannot be read", checkpoint_path);
  FileReadLog::note_read(path, static_cast<int64_t>(text.str().size()));
  if (index_checksum(text.str()) != checksum->second) {
    throw_unusable(path + ": does not match the checksum its checkpoint records (the file is damaged)",
                   checkpoint_path);
  }
  ShardedIndex index;
  try {
    index = parse_index(text.str());
  } catch (const std::exception&) {  // JSON that a tandem did not write, though its checksum matches
    throw_unusable(path + ": not an index of a sharded tandem checkpoint (format " + kIndexFormat + ")",
                   checkpoint_path);
  }
  const std::string inconsistency = index_inconsistency(index);
  if (!inconsistency.empty()) throw_unusable(fmt::format("{}: {} (the index is damaged)", path, inconsistency), checkpoint_path);
  return index;
}

}  // namespace tandem::checkpoint
