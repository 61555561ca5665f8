#pragma once
// The safetensors format (what PyTorch and the Hugging Face ecosystem exchange weights in): 8 bytes of
// little-endian header length N, N bytes of JSON
//   {"NAME": {"dtype": "F32", "shape": [..], "data_offsets": [BEGIN, END]}, ..., "__metadata__": {"k": "v"}}
// then the raw little-endian tensor bytes, offsets relative to the end of the header. tandem uses it for
// weights files (checkpoint/weights.h) and checkpoints (see docs/checkpoint.md).
#include <torch/types.h>

#include <fstream>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace tandem::checkpoint {

// Named tensors in file order, plus the string metadata.
struct TensorFile {
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  std::map<std::string, std::string> metadata;

  // nullptr-like undefined tensor if absent.
  torch::Tensor find(const std::string& name) const;
};

// Writes atomically: to PATH.tmp.<pid>, fsync, rename over PATH, fsync the directory; a crash leaves either
// the old file or the new one. Tensors are written contiguous from CPU; names must be unique and not
// "__metadata__". Supported dtypes: F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL. Throws Error naming the file,
// also when the directory cannot be synced after the rename (the new file is then in place but may not survive
// a crash).
void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, torch::Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// One tensor's place in a file, as its header says (offsets relative to the data section).
struct TensorEntry {
  std::string name;
  torch::ScalarType dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0;
  uint64_t end = 0;
};

// A file's header, checked against the file's size, with its tensors read one at a time on request: a reader
// that needs a few of many tensors (a rank of a sharded checkpoint, docs/checkpoint.md) holds only those.
// Throws as load_safetensors does. Holds the file open until destroyed.
class SafetensorsReader {
 public:
  explicit SafetensorsReader(std::string path);

  const std::string& path() const { return path_; }
  const std::vector<TensorEntry>& entries() const { return entries_; }  // in the file's data order
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const TensorEntry* find(const std::string& name) const;  // null if absent
  // One tensor, on the CPU; InvalidArgument naming the file when it is absent or cut short.
  torch::Tensor read(const std::string& name);

 private:
  std::string path_;
  std::ifstream in_;
  uint64_t data_start_ = 0;
  std::vector<TensorEntry> entries_;
  std::map<std::string, std::string> metadata_;
};

// Reads every tensor onto the CPU. A missing, truncated, corrupt or unsupported file throws InvalidArgument naming
// the file and what is wrong; one that is there but cannot be opened (too many open files, no permission) throws
// Error, since that says nothing of its contents.
TensorFile load_safetensors(const std::string& path);

}  // namespace tandem::checkpoint
