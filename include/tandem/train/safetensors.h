#pragma once
// The safetensors format (what PyTorch and the Hugging Face ecosystem exchange weights in): 8 bytes of
// little-endian header length N, N bytes of JSON
//   {"NAME": {"dtype": "F32", "shape": [..], "data_offsets": [BEGIN, END]}, ..., "__metadata__": {"k": "v"}}
// then the raw little-endian tensor bytes, offsets relative to the end of the header. tandem uses it for
// --init/--weights, --save-weights and checkpoints (see docs/checkpoint.md).
#include <torch/nn/module.h>
#include <torch/types.h>

#include <fstream>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace tandem::train {

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
// that needs a few of many tensors (a rank of a sharded checkpoint, train/checkpoint.h) holds only those.
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

// The module's parameters and buffers by their dotted names (its state dict), detached.
std::vector<std::pair<std::string, torch::Tensor>> named_state(const torch::nn::Module& module);

void save_weights(const torch::nn::Module& module, const std::string& path,
                  const std::map<std::string, std::string>& metadata = {});

// What load_weights did, each tensor listed once. `loaded` holds the model's names of the tensors copied;
// `skipped` holds file tensors not used, each "NAME (why)"; `missing` holds model tensors the file has no tensor
// for (a tensor of the wrong shape is in `skipped`, not here).
struct LoadReport {
  std::vector<std::string> loaded;
  std::vector<std::string> skipped;
  std::vector<std::string> missing;
};

// Copies file tensors into the module's same-named parameters/buffers, cast to their dtype. A file name the model
// lacks is tried without a leading "module.", the prefix of every name in a state dict that PyTorch saved from a
// DistributedDataParallel or DataParallel wrapper. Tensors whose name is unknown or whose shape differs are
// skipped and listed, "NAME (shape [3, 2] in the file, [2, 3] in the model)". The seeds' pretrained-weight filter
// compared element counts instead, which lets a transposed or otherwise rearranged tensor through; its values
// would land in the wrong places. With strict, any skipped or missing tensor throws InvalidArgument naming it
// (and both shapes) instead, before anything is copied. A file of which no tensor fits a model that has any
// throws InvalidArgument too: training would start from scratch as if no file had been given.
LoadReport load_weights(torch::nn::Module& module, const std::string& path, bool strict = false);
LoadReport load_weights(torch::nn::Module& module, const TensorFile& file, const std::string& path, bool strict);

}  // namespace tandem::train
