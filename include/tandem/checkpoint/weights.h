#pragma once
// Weights files: a model's parameters and buffers by their state-dict names, in safetensors (what `tandem train
// --save-weights` writes, what PyTorch and Hugging Face exchange), and the import of weights into a model
// (`--init`) from a weights file or from any tandem checkpoint.
#include <torch/nn/module.h>
#include <torch/types.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "tandem/checkpoint/safetensors.h"

namespace tandem::checkpoint {

// The module's parameters and buffers by their dotted names (its state dict), detached.
std::vector<std::pair<std::string, torch::Tensor>> named_state(const torch::nn::Module& module);

// A path ending in '/' names a new folder of sharded safetensors (sharded_safetensors.h: files of at most 5 GB and
// their index, as Hugging Face publishes large models); any other path one safetensors file.
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

// The weights in the file at `path` for load_weights (`--init`): a weights file's tensors as they are, or a tandem
// checkpoint's model alone (no optimizer, no position) under the model's names, a sharded checkpoint's parameters
// gathered whole from its parts. A checkpoint is checked as load_checkpoint checks it; an unreadable file, a
// damaged checkpoint or a missing part throws InvalidArgument in one line naming the file.
TensorFile read_model_weights(const std::string& path);

}  // namespace tandem::checkpoint
