#pragma once
// Whether a checkpoint fits the model it is restored into, compared before anything is copied: a run dir continued
// with another model (or another number of classes) is one line naming both models and the first tensor that
// differs, where load_weights would list every one. Internal to checkpoint/.
#include <torch/nn/module.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "tandem/checkpoint/safetensors.h"

namespace tandem::checkpoint {

using NamedShapes = std::vector<std::pair<std::string, std::vector<int64_t>>>;

// The model tensors a checkpoint holds (`saved`, names without "model.") against `module`'s: InvalidArgument, one
// line naming both models (`file`'s record of its model, `saved_model_name`: the run's `model`) and the first
// tensor that differs.
void require_same_model(const TensorFile& file, const NamedShapes& saved, const torch::nn::Module& module,
                        const std::string& path, const std::string& saved_model_name);

}  // namespace tandem::checkpoint
