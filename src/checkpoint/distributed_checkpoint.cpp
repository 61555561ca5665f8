// PyTorch's distributed checkpoints (tandem/checkpoint/distributed_checkpoint.h): the metadata through the bounded
// pickle reader, each box from its archive, whole tensors put together and checked box by box.
#include "tandem/checkpoint/distributed_checkpoint.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <set>
#include <type_traits>

#include "dcp_metadata.h"
#include "folder_output.h"
#include "tensor_boxes.h"
#include "torch_archive.h"
#include "tandem/util/atomic_file.h"
#include "tandem/util/error.h"

namespace tandem::checkpoint {
namespace {

constexpr const char* kMetadataFile = ".metadata";
constexpr const char* kParamGroupsPrefix = "optimizer.param_groups.";

std::ifstream open_checkpoint_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    if (errno == ENOENT) {
      throw InvalidArgument(path + ": missing (the checkpoint's metadata names it: the checkpoint is incomplete)");
    }
    throw Error(fmt::format("{}: cannot open it: {}", path, std::strerror(errno)));
  }
  return in;
}

// The bytes [offset, offset + length) of a file of the checkpoint, or the whole file when length is -1, read into
// `Buffer` (a std::string, or a uint8 tensor whose memory a piece's tensor then shares).
template <typename Buffer>
Buffer read_checkpoint_bytes(const std::string& path, uint64_t offset, int64_t length) {
  std::ifstream in = open_checkpoint_file(path);
  in.seekg(0, std::ios::end);
  const std::streamoff end = in.tellg();
  std::error_code error;
  if (end < 0 || !std::filesystem::is_regular_file(path, error)) {
    throw InvalidArgument(path + ": not a file (the checkpoint's metadata names it as one of its files)");
  }
  const uint64_t size = static_cast<uint64_t>(end);
  const uint64_t wanted = length < 0 ? size : static_cast<uint64_t>(length);
  if (offset > size || wanted > size - offset) {
    throw InvalidArgument(fmt::format("{}: cut short: the metadata places a piece at bytes [{}, {}) of its {} bytes",
                                      path, offset, offset + wanted, size));
  }
  Buffer bytes;
  char* data = nullptr;
  if constexpr (std::is_same_v<Buffer, std::string>) {
    bytes.resize(wanted);
    data = bytes.data();
  } else {
    bytes = torch::empty({static_cast<int64_t>(wanted)}, torch::kUInt8);
    data = static_cast<char*>(bytes.data_ptr());
  }
  in.seekg(static_cast<std::streamoff>(offset));
  if (!in.read(data, static_cast<std::streamsize>(wanted))) throw Error(path + ": cannot read it");
  return bytes;
}

// A piece's file: a plain name inside the checkpoint's folder, never a path that leads out of it.
std::string piece_file(const std::string& dir, const DcpStorage& place, const std::string& metadata_path) {
  if (place.file.empty() || place.file.find('/') != std::string::npos || place.file == "." || place.file == "..") {
    throw InvalidArgument(fmt::format("{}: names the piece file '{}', which is not a file of the checkpoint's folder "
                                      "(the metadata is damaged or forged)", metadata_path, place.file));
  }
  return dir + "/" + place.file;
}

bool is_zip(const std::string& path) {
  std::ifstream in = open_checkpoint_file(path);
  char magic[4] = {};
  in.read(magic, 4);
  return in && std::memcmp(magic, "PK\x03\x04", 4) == 0;
}

// A bytes entry's value as text: a scalar, or a tuple or list of scalars (betas, params); nothing nested, so that a
// forged list holding itself cannot recurse. nullopt for anything else.
std::optional<std::string> rendered_scalar(const PickleValue& value) {
  using Kind = PickleValue::Kind;
  switch (value.kind) {
    case Kind::kNone: return "none";
    case Kind::kBool: return value.boolean ? "true" : "false";
    case Kind::kInt: return std::to_string(value.integer);
    case Kind::kFloat: return fmt::format("{}", value.real);
    case Kind::kString: return value.text;
    default: return std::nullopt;
  }
}

std::optional<std::string> rendered(const PickleValue& value) {
  if (!value.is(PickleValue::Kind::kTuple) && !value.is(PickleValue::Kind::kList)) return rendered_scalar(value);
  std::vector<std::string> items;
  for (const PickleValue* item : value.items) {
    std::optional<std::string> text = rendered_scalar(*item);
    if (!text) return std::nullopt;
    items.push_back(std::move(*text));
  }
  return fmt::format("[{}]", fmt::join(items, ", "));
}

// Before anything is allocated for a tensor: its boxes' elements add up to its own, and each box fits in the bytes
// its file holds for it, so that a forged shape cannot make the reader allocate more than the files hold.
void check_tensor_fits_its_files(const std::string& name, const DcpTensor& tensor,
                                 const std::function<const DcpStorage&(const std::vector<int64_t>&)>& place_of,
                                 const std::string& dir, const std::string& metadata_path) {
  constexpr __int128 kMostElements = int64_t{1} << 62;
  const auto volume = [&](const std::vector<int64_t>& dims) {
    __int128 elements = 1;
    for (int64_t d : dims) {
      elements *= d;
      if (d < 0 || elements > kMostElements) {
        throw InvalidArgument(fmt::format("{}: gives '{}' a shape or box of more elements than any file holds (the "
                                          "metadata is damaged)", metadata_path, name));
      }
    }
    return elements;
  };
  const __int128 whole = volume(tensor.shape);
  __int128 covered = 0;
  const uint64_t element_bytes = c10::elementSize(tensor.dtype);
  for (const DcpChunk& chunk : tensor.chunks) {
    const __int128 elements = volume(chunk.sizes);
    const DcpStorage& place = place_of(chunk.offsets);
    std::error_code error;
    const std::string path = piece_file(dir, place, metadata_path);
    const uintmax_t file_size = std::filesystem::file_size(path, error);
    if (!error && (place.offset > file_size || place.length > file_size - place.offset)) {
      throw InvalidArgument(fmt::format("{}: cut short: the metadata places a piece at bytes [{}, {}) of its {} bytes",
                                        path, place.offset, place.offset + place.length, file_size));
    }
    if (elements * element_bytes > place.length) {
      throw InvalidArgument(fmt::format("{}: places a piece of '{}' of {} bytes in {} bytes of {} (the checkpoint's "
                                        "files are not of one save)",
                                        metadata_path, name, static_cast<int64_t>(elements * element_bytes),
                                        place.length, place.file));
    }
    covered += elements;
  }
  if (covered != whole) {
    throw InvalidArgument(fmt::format("{}: the pieces of '{}' hold {} elements and the tensor {} (the metadata is "
                                      "damaged)", metadata_path, name, static_cast<int64_t>(covered),
                                      static_cast<int64_t>(whole)));
  }
}

}  // namespace

bool is_distributed_checkpoint(const std::string& path) {
  std::error_code error;
  return std::filesystem::is_directory(path, error) &&
         std::filesystem::exists(std::filesystem::path(path) / kMetadataFile, error);
}

TensorFile read_distributed_checkpoint(const std::string& dir, const std::function<bool(const std::string&)>& filter) {
  const auto wanted = [&](const std::string& name) { return !filter || filter(name); };
  const std::string metadata_path = dir + "/" + kMetadataFile;
  const DcpMetadata metadata = parse_dcp_metadata(read_checkpoint_bytes<std::string>(metadata_path, 0, -1), metadata_path);
  const auto place_of = [&](const std::string& name, const std::vector<int64_t>& offsets) -> const DcpStorage& {
    const auto found = metadata.storage.find({name, offsets});
    if (found == metadata.storage.end()) {
      throw InvalidArgument(fmt::format("{}: names a piece of '{}' at {} that no file holds (the metadata is "
                                        "damaged)", metadata_path, name, offsets));
    }
    return found->second;
  };

  TensorFile file;
  for (const auto& [name, tensor] : metadata.tensors) {
    if (!wanted(name)) continue;
    check_tensor_fits_its_files(
        name, tensor, [&, &name = name](const std::vector<int64_t>& offsets) -> const DcpStorage& {
          return place_of(name, offsets);
        },
        dir, metadata_path);
    TensorAssembly whole(name, tensor.shape, tensor.dtype, dir);
    for (const DcpChunk& chunk : tensor.chunks) {
      const DcpStorage& place = place_of(name, chunk.offsets);
      const std::string path = piece_file(dir, place, metadata_path);
      const std::string source = fmt::format("{} (the piece of '{}' at {})", path, name, chunk.offsets);
      // PyTorch's safetensors serialization puts each rank's pieces in one safetensors file, under their names.
      torch::Tensor piece =
          is_zip(path) ? read_torch_archive_tensor(
                             read_checkpoint_bytes<torch::Tensor>(path, place.offset, static_cast<int64_t>(place.length)),
                             source)
                       : SafetensorsReader(path).read(name);
      if (piece.sizes() != c10::IntArrayRef(chunk.sizes)) {
        throw InvalidArgument(fmt::format("{}: holds a piece of shape {} where the metadata says {} (the checkpoint's "
                                          "files are not of one save)", source, piece.sizes(), chunk.sizes));
      }
      whole.add(chunk.offsets, piece);
    }
    file.tensors.emplace_back(name, whole.finish());
  }
  // The optimizer's hyper-parameters are read strictly; other objects a run saved beside them (torchtitan's
  // dataloader and train_state, raw bytes or pickles of its own classes) are not tandem's to read.
  for (const std::string& name : metadata.byte_entries) {
    if (!wanted(name)) continue;
    const bool needed = name.rfind(kParamGroupsPrefix, 0) == 0;
    const DcpStorage& place = place_of(name, {});
    const std::string path = piece_file(dir, place, metadata_path);
    try {
      const PickleDocument value = read_torch_archive_value(
          read_checkpoint_bytes<std::string>(path, place.offset, static_cast<int64_t>(place.length)),
          path + " (entry '" + name + "')");
      std::optional<std::string> text = rendered(value.root());
      if (text) {
        file.metadata[name] = std::move(*text);
      } else if (needed) {
        throw InvalidArgument(fmt::format("{} (entry '{}'): holds an object other than a number, a flag, a string or "
                                          "a flat tuple of them", path, name));
      }
    } catch (const InvalidArgument&) {
      if (needed) throw;
    }
  }
  // Each name's path in the nested state dict it was flattened from, where the metadata records it: "model/fc.weight"
  // in torchtitan's {"model": ..., "optimizer": ...}, the name itself in a plain state dict.
  for (const auto& [name, path] : metadata.paths) {
    if (!wanted(name)) continue;
    std::vector<std::string> keys;
    for (const DcpMetadata::PathPart& part : path) keys.push_back(part.key);
    file.metadata[kNestedNamePrefix + name] = fmt::format("{}", fmt::join(keys, "/"));
  }
  return file;
}

struct DistributedCheckpointWriter::State {
  explicit State(std::string dir) : folder(std::move(dir)) {}
  FolderOutput folder;
  DcpMetadata metadata;
  std::set<int> ranks;
};

DistributedCheckpointWriter::DistributedCheckpointWriter(std::string dir)
    : state_(std::make_unique<State>(std::move(dir))) {}

DistributedCheckpointWriter::~DistributedCheckpointWriter() = default;

namespace {

// A flat name's path in the nested state dict, for PyTorch's readers that rebuild the nesting from the metadata
// alone: a parameter's name keeps its dots, a param group's index is a number.
std::vector<DcpMetadata::PathPart> nested_path(const std::string& name) {
  const auto starts = [&](const std::string& prefix) { return name.compare(0, prefix.size(), prefix) == 0; };
  if (starts("model.")) return {{"model"}, {name.substr(6)}};
  if (starts("optimizer.state.")) {
    const size_t field = name.rfind('.');
    return {{"optimizer"}, {"state"}, {name.substr(16, field - 16)}, {name.substr(field + 1)}};
  }
  if (starts("optimizer.param_groups.")) {
    const size_t index_end = name.find('.', 23);
    return {{"optimizer"}, {"param_groups"}, {name.substr(23, index_end - 23), true}, {name.substr(index_end + 1)}};
  }
  return {{name}};
}

}  // namespace

void DistributedCheckpointWriter::write_file(int rank, const std::vector<TensorBoxData>& boxes,
                                             const std::vector<ByteEntry>& bytes) {
  TANDEM_CHECK(state_->ranks.insert(rank).second, "rank ", rank, "'s file written twice");
  const std::string name = fmt::format("__{}_0.distcp", rank);
  // Each piece is a zip archive of its own, whose sizes are 32-bit without zip64 (which this writer does not write):
  // refused before the file is begun.
  constexpr uint64_t kLargestPiece = 0xffffffffull - (1ull << 16);
  for (const TensorBoxData& box : boxes) {
    const uint64_t bytes = static_cast<uint64_t>(box.data.numel()) * box.data.element_size();
    if (bytes > kLargestPiece) {
      throw InvalidArgument(fmt::format("{}: a piece of '{}' holds {:.2f} GB, and pieces of 4 GiB or more (zip64 "
                                        "archives) are not written yet; convert a sharded checkpoint of more ranks, "
                                        "whose pieces are smaller",
                                        state_->folder.dir(), box.name, bytes / 1e9));
    }
  }
  DcpMetadata& metadata = state_->metadata;
  write_file_atomically(state_->folder.path(name), [&](const FileAppender& append) {
    uint64_t offset = 0;
    const auto to_file = [&](std::string_view bytes) { append(bytes.data(), bytes.size()); };
    for (const TensorBoxData& box : boxes) {
      const uint64_t size = write_torch_archive_of_tensor(box.data, to_file);
      metadata.storage[{box.name, box.offsets}] = {name, offset, size};
      offset += size;
      DcpTensor& tensor = metadata.tensors[box.name];
      tensor.dtype = box.data.scalar_type();
      tensor.shape = box.shape;
      tensor.chunks.push_back({box.offsets, box.data.sizes().vec()});
      metadata.paths[box.name] = nested_path(box.name);
    }
    for (const ByteEntry& entry : bytes) {
      const uint64_t size = write_torch_archive_of_value(entry.pickle, to_file);
      metadata.storage[{entry.name, {}}] = {name, offset, size};
      offset += size;
      metadata.byte_entries.push_back(entry.name);
      metadata.paths[entry.name] = nested_path(entry.name);
    }
  });
}

void DistributedCheckpointWriter::finish() {
  for (const auto& [name, tensor] : state_->metadata.tensors) {
    int64_t covered = 0;
    for (const DcpChunk& chunk : tensor.chunks) covered += c10::multiply_integers(chunk.sizes);
    TANDEM_CHECK(covered == c10::multiply_integers(tensor.shape), "the boxes written of '", name,
                 "' do not tile it");
  }
  write_file_atomically(state_->folder.path(kMetadataFile), write_dcp_metadata(state_->metadata));
  state_->folder.publish();
}

}  // namespace tandem::checkpoint
