#pragma once
// The pieces of checkpoint.cpp that a sharded checkpoint (sharded_checkpoint.h) shares with the full one, so that
// both are written and checked by one path: the checksummed safetensors files, the main file (its state fields,
// the optimizer's archive, the generators and the user's extra state) and the checks made before anything is
// restored. Internal to src/train.
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "tandem/train/checkpoint.h"
#include "tandem/train/safetensors.h"

namespace tandem::train {

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;
using NamedShapes = std::vector<std::pair<std::string, std::vector<int64_t>>>;

// Adds crc32c.<entry> for every tensor's bytes and crc32c.__header__ to `metadata` and writes `path` atomically.
void save_checksummed(const std::string& path, const NamedTensors& tensors, std::map<std::string, std::string> metadata);
// What is wrong with a checksummed file's header (its entries' names, dtypes and shapes, and its metadata), or
// with one entry's bytes: one line naming `path` (and the entry), or "".
std::string header_damage(const std::vector<TensorEntry>& entries, const std::map<std::string, std::string>& metadata,
                          const std::string& path);
std::string entry_damage(const std::string& name, const torch::Tensor& bytes,
                         const std::map<std::string, std::string>& metadata, const std::string& path);
// `what` is wrong with the checkpoint at `path` itself: one line that says to move it aside.
[[noreturn]] void throw_unusable(const std::string& what, const std::string& path);

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
// The model tensors a checkpoint holds (names without "model.") against `module`'s: one line naming both models
// and the first tensor that differs.
void require_same_model(const TensorFile& file, const NamedShapes& saved, const torch::nn::Module& module,
                        const std::string& path, const std::string& saved_model_name);
// The optimizer's state from the file's archive, after checking its kind and LibTorch version.
void restore_optimizer(const TensorFile& file, const std::string& path, torch::optim::Optimizer& optimizer,
                       const std::string& kind, torch::Device device);
void read_extra(const TensorFile& file, ExtraState& extra);
torch::Device device_of(const torch::nn::Module& module);

}  // namespace tandem::train
