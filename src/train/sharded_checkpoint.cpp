#include "sharded_checkpoint.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <stdexcept>
#include <system_error>

#include "checkpoint_file.h"
#include "tandem/monitor/crc32c.h"
#include "tandem/train/run_directory.h"
#include "tandem/util/atomic_file.h"
#include "tandem/util/error.h"
#include "tandem/util/file_read_log.h"

namespace tandem::train {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kIndexFormat = "tandem-sharded-index-1";
constexpr const char* kShardFileFormat = "tandem-checkpoint-shard-1";
constexpr const char* kOptimizerStatePrefix = "optimizer.state.";
// What the main file records the index by.
constexpr const char* kIndexName = "sharded_index";
constexpr const char* kIndexChecksum = "sharded_index_crc32c";

std::string stem_of(const std::string& checkpoint_path) {
  const std::string name = fs::path(checkpoint_path).filename().string();
  return name.substr(0, name.find('.'));
}

std::string folder_of(const std::string& checkpoint_path) {
  const fs::path folder = fs::path(checkpoint_path).parent_path();
  return folder.empty() ? "." : folder.string();
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

// A reader's line without throw_unusable's advice to move the checkpoint aside: the run dir's search moves it.
std::string without_advice(const std::string& line) { return line.substr(0, line.rfind("; move ")); }

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

void write_shard_file(const std::string& checkpoint_path, int rank, int world_size,
                      const std::vector<std::pair<std::string, torch::Tensor>>& pieces) {
  save_checksummed(folder_of(checkpoint_path) + "/" + shard_file_name(checkpoint_path, rank, world_size), pieces,
                   {{"format", kShardFileFormat},
                    {"checkpoint", fs::path(checkpoint_path).filename().string()},
                    {"rank", std::to_string(rank)},
                    {"world_size", std::to_string(world_size)}});
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
  write_file_atomically(folder_of(checkpoint_path) + "/" + name, text);
  return {{kIndexName, name}, {kIndexChecksum, index_checksum(text)}};
}

ShardedCheckpointReader::ShardedCheckpointReader(const std::string& checkpoint_path,
                                                 const std::map<std::string, std::string>& metadata)
    : checkpoint_path_(checkpoint_path), folder_(folder_of(checkpoint_path)) {
  const auto name = metadata.find(kIndexName);
  const auto checksum = metadata.find(kIndexChecksum);
  if (name == metadata.end() || checksum == metadata.end()) {
    throw_unusable(checkpoint_path + ": a sharded checkpoint whose metadata does not name its index", checkpoint_path);
  }
  if (name->second.find('/') != std::string::npos) {
    throw_unusable(checkpoint_path + ": its metadata names an index outside its folder", checkpoint_path);
  }
  const std::string path = folder_ + "/" + name->second;
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
  try {
    index_ = parse_index(text.str());
  } catch (const std::exception&) {  // JSON that a tandem did not write, though its checksum matches
    throw_unusable(path + ": not an index of a sharded tandem checkpoint (format " + kIndexFormat + ")",
                   checkpoint_path);
  }
  const std::string inconsistency = index_inconsistency(index_);
  if (!inconsistency.empty()) throw_unusable(fmt::format("{}: {} (the index is damaged)", path, inconsistency), checkpoint_path);
}

ShardedCheckpointReader::~ShardedCheckpointReader() = default;

std::unique_ptr<SafetensorsReader> ShardedCheckpointReader::open_checked(const std::string& file) const {
  const std::string path = folder_ + "/" + file;
  std::unique_ptr<SafetensorsReader> reader;
  try {
    reader = std::make_unique<SafetensorsReader>(path);
  } catch (const InvalidArgument& unreadable) {  // missing, cut short, not safetensors
    throw_unusable(fmt::format("{} (a shard file of {})", unreadable.what(), checkpoint_path_), checkpoint_path_);
  }
  std::string damage = header_damage(reader->entries(), reader->metadata(), path);
  const auto meta = [&](const std::string& key) {
    auto it = reader->metadata().find(key);
    return it == reader->metadata().end() ? std::string() : it->second;
  };
  if (damage.empty() && (meta("format") != kShardFileFormat ||
                         meta("checkpoint") != fs::path(checkpoint_path_).filename().string())) {
    damage = fmt::format("{}: not a shard file of {}", path, checkpoint_path_);
  }
  if (!damage.empty()) throw_unusable(damage, checkpoint_path_);
  return reader;
}

SafetensorsReader& ShardedCheckpointReader::open(const std::string& file) {
  const auto found = std::find_if(open_files_.begin(), open_files_.end(),
                                  [&](const auto& open) { return open.first == file; });
  if (found != open_files_.end()) {
    std::rotate(open_files_.begin(), found, found + 1);  // the most recently used first
    return *open_files_.front().second;
  }
  if (open_files_.size() >= kMaxOpenFiles) open_files_.pop_back();
  open_files_.emplace(open_files_.begin(), file, open_checked(file));
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
      const std::unique_ptr<SafetensorsReader> reader = open_checked(file);
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

bool is_sharded_checkpoint(const std::string& checkpoint_path) {
  try {
    const SafetensorsReader reader(checkpoint_path);
    const auto format = reader.metadata().find("format");
    return format != reader.metadata().end() && format->second == kShardedCheckpointFormat;
  } catch (const InvalidArgument&) {  // unreadable: whoever loads it says what is wrong
    return false;
  }
}

std::vector<std::string> sharded_checkpoint_parts(const std::string& checkpoint_path) {
  const std::string name = fs::path(checkpoint_path).filename().string();
  std::vector<std::string> parts;
  for (const std::string& entry : folder_entries(folder_of(checkpoint_path))) {
    if (checkpoint_of_part(entry) == name) parts.push_back(folder_of(checkpoint_path) + "/" + entry);
  }
  std::sort(parts.begin(), parts.end());
  return parts;
}

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

}  // namespace tandem::train
