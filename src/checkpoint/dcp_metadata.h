#pragma once
// The `.metadata` file of a PyTorch distributed checkpoint (DCP), a pickled
// `torch.distributed.checkpoint.metadata.Metadata`: what it says about each entry and where each piece lies.
// Internal to checkpoint/; docs/checkpoint.md lists the fields.
#include <torch/types.h>

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tandem::checkpoint {

// A box of a tensor: the elements [offsets, offsets + sizes) along each dimension.
struct DcpChunk {
  std::vector<int64_t> offsets;
  std::vector<int64_t> sizes;
};

struct DcpTensor {
  torch::ScalarType dtype = torch::kFloat32;
  std::vector<int64_t> shape;
  std::vector<DcpChunk> chunks;
};

// Where one item's bytes lie: `length` bytes at `offset` of `file`, a name inside the checkpoint's folder.
struct DcpStorage {
  std::string file;
  uint64_t offset = 0;
  uint64_t length = 0;
};

struct DcpMetadata {
  std::map<std::string, DcpTensor> tensors;
  std::vector<std::string> byte_entries;  // pickled objects (optimizer hyper-parameters), by their flat names
  // Each item: (name, its chunk's offsets; none for a bytes entry) -> where it lies.
  std::map<std::pair<std::string, std::vector<int64_t>>, DcpStorage> storage;
  // Each flat name's path in the nested state dict it was flattened from ("model.fc.weight": model, fc.weight);
  // PyTorch's readers that take no state dict of their own rebuild the nesting from it.
  // A list's element is named by its index, kept a number (`optimizer.param_groups.0.lr`: optimizer, param_groups,
  // 0, lr).
  struct PathPart {
    std::string key;
    bool is_index = false;
  };
  std::map<std::string, std::vector<PathPart>> paths;
};

// Throws InvalidArgument beginning with `source` on a pickle that is not such metadata, or names anything else.
DcpMetadata parse_dcp_metadata(std::string_view bytes, const std::string& source);
// The pickle PyTorch's `FileSystemReader` reads, of protocol 2.
std::string write_dcp_metadata(const DcpMetadata& metadata);


}  // namespace tandem::checkpoint
