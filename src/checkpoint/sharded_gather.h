#pragma once
// A sharded checkpoint read whole by a rank that holds the whole model (a DDP run, `--init`): each parameter and its
// per-element optimizer state gathered from the pieces. Internal to checkpoint/.
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include "sharded_checkpoint_reader.h"
#include "tandem/checkpoint/safetensors.h"

namespace tandem::checkpoint {

// The checkpoint's parameters, each gathered whole from its pieces, into `model_part`.
void add_gathered_parameters(ShardedCheckpointReader& pieces, TensorFile& model_part);
// The checkpoint's per-element optimizer state, gathered from its pieces into the state of each of `module`'s
// parameters that the archive gave a state (its scalars: Adam's step).
void fill_parameter_states(ShardedCheckpointReader& pieces, const torch::nn::Module& module,
                           torch::optim::Optimizer& optimizer);

}  // namespace tandem::checkpoint
