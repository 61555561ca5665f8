#pragma once
// PyTorch's distributed checkpoints (`torch.distributed.checkpoint`, DCP): what FSDP2 and torchtitan save. A folder
// of `.metadata` (a pickled description of every entry: each tensor's dtype, shape and the boxes it was saved in,
// and where each box's bytes lie) and `__<rank>_<n>.distcp` files, each the concatenated `torch.save` archives of one
// rank's boxes (or, with PyTorch's safetensors serialization, one safetensors file). docs/checkpoint.md has the
// fields. tandem reads one on any number of ranks and writes one that PyTorch's `dcp.load` reads on any number.
#include <torch/types.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tandem/checkpoint/safetensors.h"

namespace tandem::checkpoint {

// Whether `path` is a folder holding a `.metadata` file.
bool is_distributed_checkpoint(const std::string& path);

// Every tensor that `wanted` (all, if none) takes, whole, put together from its boxes, under its flat name
// (`model.fc1.weight`, `optimizer.state.fc1.weight.exp_avg`); every bytes entry that holds a number, a boolean, a
// string or None, or a flat tuple or list of them, in `metadata` under its flat name (`optimizer.param_groups.0.lr`
// = `0.001`; an object of another kind is skipped, outside the optimizer's param groups); and, where the metadata
// records it, each name's path in the nested state dict it was flattened from, its keys joined by '/', in
// `metadata` under kNestedNamePrefix + the name ("model/fc1.weight" for `model.fc1.weight` of a {"model": ...}
// state dict; "fc1.weight" for a plain one's). Everything is checked: the metadata's
// pickle is read bounded (a name outside DCP's own classes is refused, never run), each box against the archive it
// lies in, the boxes against each other (inside the tensor, none overlapping, all of it covered). A missing, cut
// short or damaged file throws InvalidArgument in one line naming it.
inline constexpr const char* kNestedNamePrefix = "nested:";
TensorFile read_distributed_checkpoint(const std::string& dir,
                                       const std::function<bool(const std::string&)>& wanted = {});

// One box of a tensor being written: `data` is the elements at `offsets` (its shape the box's sizes) of the tensor
// `name` of `shape`.
struct TensorBoxData {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<int64_t> offsets;
  torch::Tensor data;
};

// A bytes entry: an object PyTorch pickles (an optimizer's hyper-parameter), as a pickle of protocol 2.
struct ByteEntry {
  std::string name;
  std::string pickle;
};

// Writes a DCP folder one `.distcp` file at a time (a rank's boxes each), then its metadata. Nothing appears at
// `dir` until finish(): the files are written into `dir.tmp.<pid>`, synced and renamed. `dir` must not exist.
class DistributedCheckpointWriter {
 public:
  explicit DistributedCheckpointWriter(std::string dir);
  ~DistributedCheckpointWriter();

  // Writes `__<rank>_0.distcp` with these boxes and bytes entries; every tensor's boxes, over all files, must tile
  // it. Names are flat, as get_state_dict's {"model": ..., "optimizer": ...} flattens: `model.<parameter>`,
  // `optimizer.state.<parameter>.<field>`, `optimizer.param_groups.<i>.<key>`.
  void write_file(int rank, const std::vector<TensorBoxData>& boxes, const std::vector<ByteEntry>& bytes = {});
  void finish();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace tandem::checkpoint
