#pragma once
// Moved to tandem/checkpoint/checkpoint.h (namespace tandem::checkpoint), beside the damage check
// (checkpoint_damage.h) and the import of weights (weights.h). This header and these names in tandem::train keep
// programs written against the earlier layout compiling for one release; they go in the next.
#include "tandem/checkpoint/checkpoint.h"
#include "tandem/checkpoint/checkpoint_damage.h"
#include "tandem/checkpoint/weights.h"
#include "tandem/train/rng_state.h"
#include "tandem/train/safetensors.h"

namespace tandem::train {
using checkpoint::checkpoint_damage;
using checkpoint::CheckpointState;
using checkpoint::ExtraState;
using checkpoint::kCheckpointFormat;
using checkpoint::load_checkpoint;
using checkpoint::optimizer_kind;
using checkpoint::read_model_weights;
using checkpoint::save_checkpoint;
}  // namespace tandem::train
