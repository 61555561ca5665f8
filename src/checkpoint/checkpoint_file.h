#pragma once
// A checkpoint's main file (docs/checkpoint.md): the model's tensors under "model.", the optimizer's archive, the
// generators, the user's extra state under "extra.", and the state fields with the checksums in its metadata.
// A full checkpoint is this file alone; a sharded one's main file (sharded_index.h) holds the buffers only under
// "model." and names its other parts. Both are written and read by this one path. Internal to checkpoint/.
#include <torch/nn/module.h>

#include <map>
#include <string>

#include "checksummed_file.h"
#include "tandem/checkpoint/checkpoint.h"
#include "tandem/checkpoint/safetensors.h"

namespace tandem::checkpoint {

// What a checkpoint's main file holds beside its state: the model's tensors under "model.", the optimizer's
// archive, and (a sharded checkpoint) the format and the metadata that name its other files.
struct CheckpointContents {
  NamedTensors model;
  torch::Tensor optimizer_archive;
  std::string format = kCheckpointFormat;
  std::map<std::string, std::string> metadata;
};
void write_checkpoint_file(const std::string& path, const torch::nn::Module& module, const std::string& optimizer_kind,
                           const CheckpointContents& contents, const CheckpointState& state, const ExtraState& extra);

// The main file at `path`, read whole and checked against its checksums; InvalidArgument (throw_unusable) when not.
// A sharded checkpoint's other files are left to the reader of its pieces (ShardedCheckpointReader).
TensorFile read_checkpoint_file(const std::string& path);
CheckpointState read_state(const TensorFile& file, const std::string& path);
void read_extra(const TensorFile& file, ExtraState& extra);
// The file's model.* entries under the model's names: every tensor of a full checkpoint's model, the buffers of a
// sharded one's.
TensorFile stored_model_tensors(const TensorFile& file);
// The model's C++ type (Module::name()) as the file records it, `fallback` in checkpoints of older tandems.
std::string saved_model_class(const TensorFile& file, const std::string& fallback);
torch::Device device_of(const torch::nn::Module& module);

}  // namespace tandem::checkpoint
