// DCP's `.metadata` (dcp_metadata.h), read from and written as the pickle PyTorch 2.x writes: dataclasses made by
// NEWOBJ and filled by BUILD with their field dict, `TensorProperties` by BUILD with a tuple, sizes as `torch.Size`.
#include "dcp_metadata.h"

#include <fmt/format.h>

#include <set>

#include "pickle.h"
#include "tandem/util/error.h"

namespace tandem::checkpoint {
namespace {

using PickleKind = PickleValue::Kind;

constexpr const char* kMetadataModule = "torch.distributed.checkpoint.metadata";

struct DcpDtype {
  torch::ScalarType type;
  const char* name;
};
constexpr DcpDtype kDcpDtypes[] = {
    {torch::kFloat32, "float32"}, {torch::kFloat64, "float64"}, {torch::kFloat16, "float16"},
    {torch::kBFloat16, "bfloat16"}, {torch::kInt64, "int64"}, {torch::kInt32, "int32"}, {torch::kInt16, "int16"},
    {torch::kInt8, "int8"}, {torch::kUInt8, "uint8"}, {torch::kBool, "bool"},
};

const std::set<std::string>& metadata_globals() {
  static const std::set<std::string> names = [] {
    std::set<std::string> allowed;
    for (const char* name : {"Metadata", "TensorStorageMetadata", "BytesStorageMetadata", "TensorProperties",
                             "ChunkStorageMetadata", "MetadataIndex", "StorageMeta", "_MEM_FORMAT_ENCODING"}) {
      allowed.insert(std::string(kMetadataModule) + "." + name);
    }
    for (const auto& dtype : kDcpDtypes) allowed.insert(std::string("torch.") + dtype.name);
    allowed.insert({"torch.Size", "torch.serialization._get_layout", "torch.distributed.checkpoint.filesystem._StorageInfo",
                    "collections.OrderedDict", "pathlib.PosixPath", "pathlib.PurePosixPath", "pathlib.WindowsPath"});
    return allowed;
  }();
  return names;
}

class MetadataParser {
 public:
  explicit MetadataParser(const std::string& source) : source_(source) {}

  [[noreturn]] void damaged(const std::string& what) const {
    throw InvalidArgument(fmt::format("{}: not the metadata of a PyTorch distributed checkpoint: {}", source_, what));
  }

  const PickleValue& object(const PickleValue* value, const char* class_name, const std::string& where) const {
    if (value == nullptr || !value->is(PickleKind::kObject) || value->text != std::string(kMetadataModule) + "." + class_name) {
      damaged(fmt::format("{} is not a {}", where, class_name));
    }
    return *value;
  }
  const PickleValue& field(const PickleValue& object, const char* name, const std::string& where) const {
    const PickleValue* value = object.field(name);
    if (value == nullptr) damaged(fmt::format("{} has no field '{}'", where, name));
    return *value;
  }
  std::string text(const PickleValue& value, const std::string& where) const {
    if (!value.is(PickleKind::kString)) damaged(where + " is not a string");
    return value.text;
  }
  int64_t count(const PickleValue& value, const std::string& where) const {
    if (!value.is(PickleKind::kInt) || value.integer < 0) damaged(where + " is not a count");
    return value.integer;
  }
  // A torch.Size: REDUCE of torch.Size with one tuple of counts.
  std::vector<int64_t> size(const PickleValue& value, const std::string& where) const {
    if (!value.is(PickleKind::kObject) || value.text != "torch.Size" || value.items.size() != 1 ||
        !value.items[0]->is(PickleKind::kTuple)) {
      damaged(where + " is not a torch.Size");
    }
    std::vector<int64_t> dims;
    for (const PickleValue* dim : value.items[0]->items) dims.push_back(count(*dim, where));
    return dims;
  }
  torch::ScalarType dtype(const PickleValue& properties, const std::string& where) const {
    // PyTorch 2.x's TensorProperties pickles its fields as a tuple, dtype first; older ones as a dict.
    const PickleValue* dtype = properties.state != nullptr && properties.state->is(PickleKind::kTuple) &&
                                       !properties.state->items.empty()
                                   ? properties.state->items[0]
                                   : properties.field("dtype");
    if (dtype != nullptr && dtype->is(PickleKind::kGlobal)) {
      for (const auto& known : kDcpDtypes) {
        if (dtype->text == std::string("torch.") + known.name) return known.type;
      }
    }
    damaged(where + " has a dtype that is not read here");
  }

 private:
  const std::string& source_;
};

}  // namespace

DcpMetadata parse_dcp_metadata(std::string_view bytes, const std::string& source) {
  const PickleDocument document = read_pickle(bytes, metadata_globals(), source);
  const MetadataParser parse(source);
  const PickleValue& root = parse.object(&document.root(), "Metadata", "the file");
  DcpMetadata metadata;

  const PickleValue& entries = parse.field(root, "state_dict_metadata", "the file");
  if (!entries.is(PickleKind::kDict)) parse.damaged("state_dict_metadata is not a dict");
  for (size_t i = 0; i + 1 < entries.items.size(); i += 2) {
    const std::string name = parse.text(*entries.items[i], "a state_dict_metadata key");
    const PickleValue* entry = entries.items[i + 1];
    const std::string where = fmt::format("entry '{}'", name);
    if (entry->is(PickleKind::kObject) && entry->text == std::string(kMetadataModule) + ".BytesStorageMetadata") {
      metadata.byte_entries.push_back(name);
      continue;
    }
    const PickleValue& tensor = parse.object(entry, "TensorStorageMetadata", where);
    DcpTensor described;
    described.dtype = parse.dtype(parse.object(&parse.field(tensor, "properties", where), "TensorProperties", where), where);
    described.shape = parse.size(parse.field(tensor, "size", where), where + "'s size");
    const PickleValue& chunks = parse.field(tensor, "chunks", where);
    if (!chunks.is(PickleKind::kList)) parse.damaged(where + "'s chunks are not a list");
    for (const PickleValue* chunk : chunks.items) {
      const PickleValue& box = parse.object(chunk, "ChunkStorageMetadata", where + "'s chunk");
      described.chunks.push_back({parse.size(parse.field(box, "offsets", where), where + "'s chunk offsets"),
                                  parse.size(parse.field(box, "sizes", where), where + "'s chunk sizes")});
    }
    metadata.tensors.emplace(name, std::move(described));
  }

  // planner_data: each flat name's path in the nested state dict (a tuple of keys, a list's index a number); absent
  // or of another form in other savers' metadata, where nothing depends on it.
  const PickleValue* planner = root.field("planner_data");
  if (planner != nullptr && planner->is(PickleKind::kDict)) {
    for (size_t i = 0; i + 1 < planner->items.size(); i += 2) {
      const PickleValue* name = planner->items[i];
      const PickleValue* path = planner->items[i + 1];
      if (!name->is(PickleKind::kString) || !path->is(PickleKind::kTuple)) continue;
      std::vector<DcpMetadata::PathPart> parts;
      for (const PickleValue* part : path->items) {
        if (part->is(PickleKind::kString)) {
          parts.push_back({part->text});
        } else if (part->is(PickleKind::kInt)) {
          parts.push_back({std::to_string(part->integer), true});
        }
      }
      if (parts.size() == path->items.size()) metadata.paths[name->text] = std::move(parts);
    }
  }

  const PickleValue& storage = parse.field(root, "storage_data", "the file");
  if (!storage.is(PickleKind::kDict)) parse.damaged("storage_data is not a dict");
  for (size_t i = 0; i + 1 < storage.items.size(); i += 2) {
    const PickleValue& index = parse.object(storage.items[i], "MetadataIndex", "a storage_data key");
    const std::string name = parse.text(parse.field(index, "fqn", "a storage_data key"), "a storage_data key's fqn");
    const std::string where = fmt::format("the storage of '{}'", name);
    // A bytes entry's offset is None, which PyTorch leaves out of the pickle.
    const PickleValue* offset = index.field("offset");
    std::vector<int64_t> offsets =
        offset == nullptr || offset->is(PickleKind::kNone) ? std::vector<int64_t>{} : parse.size(*offset, where);
    const PickleValue* info = storage.items[i + 1];
    if (!info->is(PickleKind::kObject) || info->text != "torch.distributed.checkpoint.filesystem._StorageInfo") {
      parse.damaged(where + " is not a _StorageInfo");
    }
    DcpStorage place{parse.text(parse.field(*info, "relative_path", where), where + "'s file"),
                     static_cast<uint64_t>(parse.count(parse.field(*info, "offset", where), where + "'s offset")),
                     static_cast<uint64_t>(parse.count(parse.field(*info, "length", where), where + "'s length"))};
    const PickleValue* transforms = info->field("transform_descriptors");
    if (transforms != nullptr && transforms->is(PickleKind::kList) && !transforms->items.empty()) {
      parse.damaged(where + " is compressed or transformed (transform_descriptors), which is not read here");
    }
    metadata.storage[{name, std::move(offsets)}] = std::move(place);
  }
  return metadata;
}

namespace {

void write_size(PickleWriter& pickle, const std::vector<int64_t>& dims) {
  pickle.global("torch", "Size");
  pickle.mark();
  for (int64_t d : dims) pickle.integer(d);
  pickle.tuple_from_mark();
  pickle.tuple(1);
  pickle.reduce();
}

// A dataclass as Python pickles it: NEWOBJ of its class with no arguments, then BUILD with its field dict, whose
// entries `fields` writes between the mark and SETITEMS.
template <typename Fields>
void write_dataclass(PickleWriter& pickle, const char* module, const char* name, Fields&& fields) {
  pickle.global(module, name);
  pickle.tuple(0);
  pickle.newobj();
  pickle.empty_dict();
  pickle.mark();
  fields();
  pickle.setitems_from_mark();
  pickle.build();
}

void write_properties(PickleWriter& pickle, torch::ScalarType type) {
  const char* dtype = nullptr;
  for (const auto& known : kDcpDtypes) {
    if (known.type == type) dtype = known.name;
  }
  TANDEM_CHECK(dtype != nullptr, "no torch dtype name for ", c10::toString(type));
  pickle.global(kMetadataModule, "TensorProperties");
  pickle.tuple(0);
  pickle.newobj();
  pickle.mark();  // its __setstate__'s tuple: dtype, layout, requires_grad, memory format, pin_memory
  pickle.global("torch", dtype);
  pickle.global("torch.serialization", "_get_layout");
  pickle.string("torch.strided");
  pickle.tuple(1);
  pickle.reduce();
  pickle.boolean(false);
  pickle.global(kMetadataModule, "_MEM_FORMAT_ENCODING");
  pickle.integer(0);  // TORCH_CONTIGUOUS
  pickle.tuple(1);
  pickle.reduce();
  pickle.boolean(false);
  pickle.tuple_from_mark();
  pickle.build();
}

}  // namespace

std::string write_dcp_metadata(const DcpMetadata& metadata) {
  PickleWriter pickle;
  write_dataclass(pickle, kMetadataModule, "Metadata", [&] {
    pickle.string("state_dict_metadata");
    pickle.empty_dict();
    pickle.mark();
    for (const auto& [name, tensor] : metadata.tensors) {
      pickle.string(name);
      write_dataclass(pickle, kMetadataModule, "TensorStorageMetadata", [&pickle, &tensor = tensor] {
        pickle.string("properties");
        write_properties(pickle, tensor.dtype);
        pickle.string("size");
        write_size(pickle, tensor.shape);
        pickle.string("chunks");
        pickle.empty_list();
        pickle.mark();
        for (const DcpChunk& chunk : tensor.chunks) {
          write_dataclass(pickle, kMetadataModule, "ChunkStorageMetadata", [&] {
            pickle.string("offsets");
            write_size(pickle, chunk.offsets);
            pickle.string("sizes");
            write_size(pickle, chunk.sizes);
          });
        }
        pickle.appends_from_mark();
      });
    }
    for (const std::string& name : metadata.byte_entries) {
      pickle.string(name);
      write_dataclass(pickle, kMetadataModule, "BytesStorageMetadata", [] {});
    }
    pickle.setitems_from_mark();

    pickle.string("planner_data");
    pickle.empty_dict();
    pickle.mark();
    for (const auto& [name, path] : metadata.paths) {
      pickle.string(name);
      pickle.mark();
      for (const DcpMetadata::PathPart& part : path) {
        if (part.is_index) {
          pickle.integer(std::stoll(part.key));
        } else {
          pickle.string(part.key);
        }
      }
      pickle.tuple_from_mark();
    }
    pickle.setitems_from_mark();

    pickle.string("storage_data");
    pickle.empty_dict();
    pickle.mark();
    for (const auto& [key, place] : metadata.storage) {
      const bool is_bytes = metadata.tensors.count(key.first) == 0;
      write_dataclass(pickle, kMetadataModule, "MetadataIndex", [&, &key = key] {
        pickle.string("fqn");
        pickle.string(key.first);
        pickle.string("offset");
        if (is_bytes) {
          pickle.none();
        } else {
          write_size(pickle, key.second);
        }
        pickle.string("index");
        pickle.none();
      });
      write_dataclass(pickle, "torch.distributed.checkpoint.filesystem", "_StorageInfo", [&, &place = place] {
        pickle.string("relative_path");
        pickle.string(place.file);
        pickle.string("offset");
        pickle.integer(static_cast<int64_t>(place.offset));
        pickle.string("length");
        pickle.integer(static_cast<int64_t>(place.length));
        pickle.string("transform_descriptors");
        pickle.none();
      });
    }
    pickle.setitems_from_mark();

    pickle.string("storage_meta");
    pickle.none();
    pickle.string("version");
    pickle.string("1.0.0");
  });
  return pickle.finish();
}

}  // namespace tandem::checkpoint
