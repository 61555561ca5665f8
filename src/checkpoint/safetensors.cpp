#include "tandem/checkpoint/safetensors.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "tandem/util/atomic_file.h"
#include "tandem/util/error.h"
#include "tandem/util/fault_injection.h"
#include "tandem/util/file_read_log.h"

namespace tandem::checkpoint {
namespace {

using nlohmann::json;

// Headers above this are not weights files (the reference implementation's limit is 100 MB).
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

struct DtypeName {
  torch::ScalarType type;
  const char* name;
};
constexpr DtypeName kDtypes[] = {
    {torch::kFloat64, "F64"}, {torch::kFloat32, "F32"}, {torch::kFloat16, "F16"}, {torch::kBFloat16, "BF16"},
    {torch::kInt64, "I64"},   {torch::kInt32, "I32"},   {torch::kInt16, "I16"},   {torch::kInt8, "I8"},
    {torch::kUInt8, "U8"},    {torch::kBool, "BOOL"},
};

bool host_is_little_endian() {
  const uint16_t probe = 1;
  unsigned char first;
  std::memcpy(&first, &probe, 1);
  return first == 1;
}

std::string dtype_name(torch::ScalarType type, const std::string& path, const std::string& tensor) {
  for (const auto& d : kDtypes) {
    if (d.type == type) return d.name;
  }
  throw InvalidArgument(detail::concat(path, ": cannot write tensor '", tensor, "' of dtype ", c10::toString(type),
                                       " as safetensors"));
}

torch::ScalarType dtype_from_name(const std::string& name, const std::string& path, const std::string& tensor) {
  for (const auto& d : kDtypes) {
    if (name == d.name) return d.type;
  }
  throw InvalidArgument(path + ": tensor '" + tensor + "' has unsupported dtype '" + name + "'");
}

[[noreturn]] void bad_entry(const std::string& path, const std::string& tensor, const std::string& what) {
  throw InvalidArgument(path + ": tensor '" + tensor + "' " + what);
}

// Where one tensor lies in the data section and how to allocate it.
struct EntryLayout {
  torch::ScalarType type;
  std::vector<int64_t> shape;
  uint64_t begin;
  uint64_t end;
};

// Reads one header entry and checks it against the data_size bytes of data before anything is allocated: the
// byte range lies inside them and is exactly what the dtype and shape need. A crafted header would otherwise
// make the reader allocate terabytes, or overflow the size arithmetic into a small, wrong allocation.
EntryLayout entry_layout(const json& entry, uint64_t data_size, const std::string& path, const std::string& name) {
  EntryLayout layout;
  layout.type = dtype_from_name(entry.at("dtype").get<std::string>(), path, name);

  const json& offsets = entry.at("data_offsets");
  if (!offsets.is_array() || offsets.size() != 2) bad_entry(path, name, "has data_offsets that are not [BEGIN, END]");
  if (!offsets[0].is_number_unsigned() || !offsets[1].is_number_unsigned()) {
    bad_entry(path, name, "has data_offsets that are not non-negative integers: " + offsets.dump());
  }
  layout.begin = offsets[0].get<uint64_t>();
  layout.end = offsets[1].get<uint64_t>();
  if (layout.begin > layout.end) {
    bad_entry(path, name, "has data_offsets " + offsets.dump() + ": the range begins after it ends");
  }
  if (layout.end > data_size) {
    bad_entry(path, name, detail::concat("lies outside the file: its data ends at byte ", layout.end,
                                         " of the data section, which holds ", data_size,
                                         " bytes (the file was cut short)"));
  }

  const json& shape = entry.at("shape");
  if (!shape.is_array()) bad_entry(path, name, "has a shape that is not a list: " + shape.dump());
  // LibTorch keeps sizes, strides and element counts in int64_t. The bound is checked on the product of the
  // non-zero extents, not on the byte count alone: a 0 anywhere makes that count 0, yet [0, 2^64 - 1] would
  // still be a negative size to LibTorch, and [0, 2^62, 4] a stride past int64_t.
  constexpr uint64_t kMaxBytes = std::numeric_limits<int64_t>::max();
  uint64_t span = c10::elementSize(layout.type);
  bool empty = false;
  for (const json& dimension : shape) {
    if (!dimension.is_number_unsigned()) {
      bad_entry(path, name, "has a shape that is not a list of non-negative integers: " + shape.dump());
    }
    const uint64_t extent = dimension.get<uint64_t>();
    if (extent == 0) {
      empty = true;
    } else if (span > kMaxBytes / extent) {
      bad_entry(path, name, "has shape " + shape.dump() + ", too large for any file (over 2^63 bytes)");
    } else {
      span *= extent;
    }
    layout.shape.push_back(static_cast<int64_t>(extent));
  }
  const uint64_t bytes = empty ? 0 : span;
  if (layout.end - layout.begin != bytes) {
    bad_entry(path, name, detail::concat("has ", layout.end - layout.begin, " bytes but its dtype and shape need ",
                                         bytes));
  }
  return layout;
}

}  // namespace

torch::Tensor TensorFile::find(const std::string& name) const {
  for (const auto& [n, t] : tensors) {
    if (n == name) return t;
  }
  return {};
}

void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  TANDEM_CHECK(host_is_little_endian(), "safetensors writing assumes a little-endian host");
  std::vector<torch::Tensor> contiguous;
  json header = json::object();
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    if (name == "__metadata__" || !names.insert(name).second) {
      throw InvalidArgument(path + ": tensor name '" + name + "' is reserved or used twice");
    }
    torch::Tensor t = tensor.detach().to(torch::kCPU).contiguous();
    const uint64_t bytes = static_cast<uint64_t>(t.numel()) * t.element_size();
    header[name] = {{"dtype", dtype_name(t.scalar_type(), path, name)},
                    {"shape", t.sizes().vec()},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    contiguous.push_back(std::move(t));
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string text = header.dump();
  // Pad with spaces so the data starts 8-byte aligned, as the reference writer does.
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t header_size = text.size();
  unsigned char size_bytes[8];
  for (int i = 0; i < 8; ++i) size_bytes[i] = static_cast<unsigned char>(header_size >> (8 * i));

  static std::atomic<int64_t> files_written{0};
  write_file_atomically(path, [&](const FileAppender& append) {
    append(size_bytes, sizeof size_bytes);
    append(text.data(), text.size());
    for (size_t i = 0; i < contiguous.size(); ++i) {
      if (i == contiguous.size() / 2) fault::kill_point("safetensors-write", ++files_written);
      append(contiguous[i].data_ptr(), contiguous[i].numel() * contiguous[i].element_size());
    }
  });
}

SafetensorsReader::SafetensorsReader(std::string path) : path_(std::move(path)), in_(path_, std::ios::binary) {
  TANDEM_CHECK(host_is_little_endian(), "safetensors reading assumes a little-endian host");
  // A folder opens for reading as a file does, and its size reads as 2^63 bytes.
  if (std::filesystem::is_directory(path_)) throw InvalidArgument(path_ + ": is a folder, not a safetensors file");
  if (!in_) {
    const int error = errno;
    // A file that is not there is missing (a part of a checkpoint never written, a path mistyped). Any other
    // failure to open it (too many open files, no permission, an I/O error) says nothing of what it holds: a
    // checkpoint must not be set aside as damaged for it, so it is another kind of error.
    if (error == ENOENT || error == ENOTDIR) {
      throw InvalidArgument(path_ + ": cannot open safetensors file: " + std::strerror(error));
    }
    throw Error(path_ + ": cannot open safetensors file: " + std::strerror(error) +
                " (which says nothing of its contents: it is not treated as damaged)");
  }
  FileReadLog::note_open(path_);
  in_.seekg(0, std::ios::end);
  const uint64_t file_size = static_cast<uint64_t>(in_.tellg());
  in_.seekg(0);
  unsigned char size_bytes[8];
  if (file_size < 8 || !in_.read(reinterpret_cast<char*>(size_bytes), 8)) {
    throw InvalidArgument(detail::concat(path_, ": the file is ", file_size, " bytes, shorter than the 8 that give a ",
                                         "safetensors file's header length (it was cut short, or is not one)"));
  }
  uint64_t header_size = 0;
  for (int i = 0; i < 8; ++i) header_size |= static_cast<uint64_t>(size_bytes[i]) << (8 * i);
  if (header_size > kMaxHeaderBytes || header_size > file_size - 8) {
    throw InvalidArgument(detail::concat(path_, ": its header length says ", header_size, " bytes, but the file holds ",
                                         file_size - 8, " after it (it was cut short, or is not a safetensors file)"));
  }
  std::string text(header_size, '\0');
  in_.read(text.data(), static_cast<std::streamsize>(header_size));
  FileReadLog::note_read(path_, static_cast<int64_t>(8 + header_size));
  json header;
  try {
    header = json::parse(text);
  } catch (const json::parse_error& error) {
    // The parser's own text ("[json.exception.parse_error.101] ... ill-formed UTF-8 byte") tells a user nothing
    // they can act on; where the header breaks does.
    throw InvalidArgument(detail::concat(path_, ": its header is not valid JSON at byte ", error.byte, " of ",
                                         header_size, " (the file is damaged, or is not a safetensors file)"));
  } catch (const json::exception&) {  // a number too large for any type
    throw InvalidArgument(path_ + ": its header is not JSON that can be read (the file is damaged, or is not a "
                                  "safetensors file)");
  }
  if (!header.is_object()) {
    throw InvalidArgument(path_ + ": its header is not a JSON object (the file is damaged, or is not a safetensors "
                                  "file)");
  }

  data_start_ = 8 + header_size;
  const uint64_t data_size = file_size - data_start_;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    if (name == "__metadata__") {
      if (!it->is_object()) throw InvalidArgument(path_ + ": __metadata__ must be an object of strings");
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string()) throw InvalidArgument(path_ + ": __metadata__ value '" + m.key() + "' is not a string");
        metadata_[m.key()] = m->get<std::string>();
      }
      continue;
    }
    try {
      const EntryLayout layout = entry_layout(*it, data_size, path_, name);
      entries_.push_back({name, layout.type, layout.shape, layout.begin, layout.end});
    } catch (const json::exception&) {  // a key missing, or a value of another JSON type
      throw InvalidArgument(path_ + ": tensor '" + name + "' has a malformed header entry (it needs a dtype name, "
                                    "a shape and data_offsets; the file is damaged, or is not a safetensors file)");
    }
  }
  // The file's data order, which is the writer's order (the JSON object itself is unordered).
  std::stable_sort(entries_.begin(), entries_.end(),
                   [](const TensorEntry& a, const TensorEntry& b) { return a.begin < b.begin; });
}

const TensorEntry* SafetensorsReader::find(const std::string& name) const {
  for (const TensorEntry& entry : entries_) {
    if (entry.name == name) return &entry;
  }
  return nullptr;
}

torch::Tensor SafetensorsReader::read(const std::string& name) {
  const TensorEntry* entry = find(name);
  if (!entry) throw InvalidArgument(path_ + ": has no tensor '" + name + "'");
  torch::Tensor t = torch::empty(entry->shape, torch::TensorOptions().dtype(entry->dtype));
  const uint64_t bytes = entry->end - entry->begin;
  in_.clear();
  in_.seekg(static_cast<std::streamoff>(data_start_ + entry->begin));
  if (bytes > 0 && !in_.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(bytes))) {
    throw InvalidArgument(path_ + ": the file ended while reading tensor '" + name + "' (it was cut short)");
  }
  FileReadLog::note_read(path_, static_cast<int64_t>(bytes));
  return t;
}

TensorFile load_safetensors(const std::string& path) {
  SafetensorsReader reader(path);
  TensorFile file;
  file.metadata = reader.metadata();
  for (const TensorEntry& entry : reader.entries()) file.tensors.emplace_back(entry.name, reader.read(entry.name));
  return file;
}

}  // namespace tandem::checkpoint
