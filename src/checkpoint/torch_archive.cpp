// torch.save archives (torch_archive.h): their records found by name, the tensor rebuilt from its storage within
// bounds that the pickle's size and stride are checked against before anything is copied.
#include "torch_archive.h"

#include <fmt/format.h>

#include <cstring>
#include <set>

#include "stored_zip.h"
#include "tandem/util/error.h"

namespace tandem::checkpoint {
namespace {

struct StorageName {
  torch::ScalarType type;
  const char* name;
};
constexpr StorageName kStorages[] = {
    {torch::kFloat32, "FloatStorage"}, {torch::kFloat64, "DoubleStorage"}, {torch::kFloat16, "HalfStorage"},
    {torch::kBFloat16, "BFloat16Storage"}, {torch::kInt64, "LongStorage"}, {torch::kInt32, "IntStorage"},
    {torch::kInt16, "ShortStorage"}, {torch::kInt8, "CharStorage"}, {torch::kUInt8, "ByteStorage"},
    {torch::kBool, "BoolStorage"},
};

const std::set<std::string>& tensor_globals() {
  static const std::set<std::string> names = [] {
    std::set<std::string> allowed = {"torch._utils._rebuild_tensor_v2", "collections.OrderedDict"};
    for (const auto& storage : kStorages) allowed.insert(std::string("torch.") + storage.name);
    return allowed;
  }();
  return names;
}

// The records of an archive under its one folder (PyTorch names it after the file, "archive" for a buffer).
class ArchiveRecords {
 public:
  ArchiveRecords(std::string_view bytes, const std::string& source)
      : source_(source), entries_(read_stored_zip(bytes, source)) {
    for (const StoredZipEntry& entry : entries_) {
      const size_t slash = entry.name.find('/');
      if (slash != std::string::npos && entry.name.compare(slash + 1, std::string::npos, "data.pkl") == 0) {
        prefix_ = entry.name.substr(0, slash + 1);
        return;
      }
    }
    throw InvalidArgument(source + ": not a PyTorch archive: it has no data.pkl");
  }

  const std::string_view* find(const std::string& name) const {
    for (const StoredZipEntry& entry : entries_) {
      if (entry.name == prefix_ + name) return &entry.data;
    }
    return nullptr;
  }
  std::string_view get(const std::string& name) const {
    const std::string_view* found = find(name);
    if (found == nullptr) throw InvalidArgument(fmt::format("{}: not a PyTorch archive: it has no {}", source_, name));
    return *found;
  }
  void require_little_endian() const {
    const std::string_view* order = find("byteorder");
    if (order != nullptr && *order != "little") {
      throw InvalidArgument(fmt::format("{}: the archive is {}-endian; only little-endian archives are read",
                                        source_, std::string(*order)));
    }
  }

 private:
  const std::string& source_;
  std::vector<StoredZipEntry> entries_;
  std::string prefix_;
};

std::vector<int64_t> integers_of(const PickleValue* tuple, const std::string& source, const char* what) {
  if (tuple == nullptr || !tuple->is(PickleValue::Kind::kTuple)) {
    throw InvalidArgument(fmt::format("{}: the tensor's {} is not a tuple", source, what));
  }
  std::vector<int64_t> numbers;
  for (const PickleValue* item : tuple->items) {
    if (!item->is(PickleValue::Kind::kInt) || item->integer < 0) {
      throw InvalidArgument(fmt::format("{}: the tensor's {} holds something other than a count", source, what));
    }
    numbers.push_back(item->integer);
  }
  return numbers;
}

// A value's archive has no storage record; a tensor's has one, "0", also when it is empty.
uint64_t write_archive(const std::string& pickle, const std::string_view* storage, const ArchiveAppender& append) {
  std::vector<std::pair<std::string, std::string_view>> records = {{"archive/data.pkl", pickle},
                                                                   {"archive/byteorder", "little"}};
  if (storage != nullptr) records.emplace_back("archive/data/0", *storage);
  records.emplace_back("archive/version", "3\n");
  return write_stored_zip(records, append);
}

}  // namespace

torch::Tensor read_torch_archive_tensor(const torch::Tensor& raw, const std::string& source) {
  TANDEM_CHECK(raw.scalar_type() == torch::kUInt8 && raw.dim() == 1 && raw.is_contiguous(), "archive bytes of uint8");
  const std::string_view bytes(static_cast<const char*>(raw.data_ptr()), static_cast<size_t>(raw.numel()));
  const ArchiveRecords records(bytes, source);
  records.require_little_endian();
  const PickleDocument document = read_pickle(records.get("data.pkl"), tensor_globals(), source);
  const PickleValue& rebuild = document.root();
  const auto wrong = [&](const std::string& what) { return InvalidArgument(source + ": not a tensor's archive: " + what); };
  if (!rebuild.is(PickleValue::Kind::kObject) || rebuild.text != "torch._utils._rebuild_tensor_v2" ||
      rebuild.items.size() < 4) {
    throw wrong("its pickle is not a rebuilt tensor");
  }
  const PickleValue* id = rebuild.items[0];
  if (!id->is(PickleValue::Kind::kPersistentId) || !id->items[0]->is(PickleValue::Kind::kTuple) ||
      id->items[0]->items.size() != 5) {
    throw wrong("its storage is not a persistent id ('storage', type, key, location, size)");
  }
  const auto& storage = id->items[0]->items;
  if (!storage[1]->is(PickleValue::Kind::kGlobal) || !storage[2]->is(PickleValue::Kind::kString) ||
      !storage[4]->is(PickleValue::Kind::kInt) || !rebuild.items[1]->is(PickleValue::Kind::kInt)) {
    throw wrong("its storage id is malformed");
  }
  const StorageName* kind = nullptr;
  for (const auto& known : kStorages) {
    if (storage[1]->text == std::string("torch.") + known.name) kind = &known;
  }
  if (kind == nullptr) throw wrong(fmt::format("its storage type `{}` is not a tensor storage", storage[1]->text));
  const torch::ScalarType type = kind->type;
  const std::string_view data = records.get("data/" + storage[2]->text);
  const int64_t element_bytes = static_cast<int64_t>(c10::elementSize(type));
  const int64_t numel = storage[4]->integer;
  // Compared by division: a forged count times the element size could wrap around to the record's size.
  if (numel < 0 || data.size() % element_bytes != 0 ||
      static_cast<uint64_t>(numel) != data.size() / static_cast<uint64_t>(element_bytes)) {
    throw wrong(fmt::format("its storage of {} elements has {} bytes", numel, data.size()));
  }
  const int64_t offset = rebuild.items[1]->integer;
  const std::vector<int64_t> size = integers_of(rebuild.items[2], source, "size");
  const std::vector<int64_t> stride = integers_of(rebuild.items[3], source, "stride");
  if (size.size() != stride.size()) throw wrong("its size and stride differ in length");
  // The view may hold no more elements than its storage (the pieces PyTorch saves are whole, never broadcast), so
  // that a forged size cannot make the copy below allocate more than the file holds; and the furthest element it
  // reaches must lie in the storage. Every term is held to the storage's size first, so none of it overflows.
  __int128 elements = 1;
  __int128 furthest = offset;
  for (size_t d = 0; d < size.size(); ++d) {
    if (size[d] > numel || stride[d] > numel) throw wrong("its size or stride exceeds its storage");
    elements *= size[d];
    if (elements > numel) throw wrong("its view holds more elements than its storage");
    if (size[d] > 0) furthest += static_cast<__int128>(size[d] - 1) * stride[d];
  }
  if (elements == 0) return torch::empty(size, torch::TensorOptions().dtype(type));
  if (offset < 0 || furthest >= numel) throw wrong("its view reaches outside its storage");
  // The storage where it lies in `raw`, unless misaligned for its dtype (an archive of another writer), then a copy.
  const int64_t at = static_cast<int64_t>(data.data() - bytes.data());
  torch::Tensor flat;
  if (at % element_bytes == 0) {
    flat = raw.narrow(0, at, static_cast<int64_t>(data.size())).view(type);
  } else {
    flat = torch::empty({numel}, torch::TensorOptions().dtype(type));
    std::memcpy(flat.data_ptr(), data.data(), data.size());
  }
  return flat.as_strided(size, stride, flat.storage_offset() + offset).contiguous();
}

PickleDocument read_torch_archive_value(std::string_view bytes, const std::string& source) {
  const ArchiveRecords records(bytes, source);
  return read_pickle(records.get("data.pkl"), {}, source);
}

uint64_t write_torch_archive_of_tensor(const torch::Tensor& tensor, const ArchiveAppender& append) {
  const torch::Tensor data = tensor.detach().to(torch::kCPU).contiguous();
  const char* storage_name = nullptr;
  for (const auto& known : kStorages) {
    if (known.type == data.scalar_type()) storage_name = known.name;
  }
  TANDEM_CHECK(storage_name != nullptr, "no PyTorch storage for dtype ", c10::toString(data.scalar_type()));
  PickleWriter pickle;
  pickle.global("torch._utils", "_rebuild_tensor_v2");
  pickle.mark();
  pickle.mark();
  pickle.string("storage");
  pickle.global("torch", storage_name);
  pickle.string("0");
  pickle.string("cpu");
  pickle.integer(data.numel());
  pickle.tuple_from_mark();
  pickle.persistent_id();
  pickle.integer(0);
  for (const auto& dims : {data.sizes(), data.strides()}) {
    pickle.mark();
    for (int64_t d : dims) pickle.integer(d);
    pickle.tuple_from_mark();
  }
  pickle.boolean(false);
  pickle.global("collections", "OrderedDict");
  pickle.tuple(0);
  pickle.reduce();
  pickle.tuple_from_mark();
  pickle.reduce();
  const std::string_view bytes(static_cast<const char*>(data.data_ptr()), data.numel() * data.element_size());
  return write_archive(pickle.finish(), &bytes, append);
}

uint64_t write_torch_archive_of_value(const std::string& pickle, const ArchiveAppender& append) {
  return write_archive(pickle, nullptr, append);
}

}  // namespace tandem::checkpoint
