#pragma once
// FSDP's sharded checkpoints (docs/checkpoint.md, "Sharded checkpoints", has the files): each rank writes the
// pieces its shards hold and reads back only the pieces its shards need, on any world size, so no rank gathers
// the model. A shard is a slice of its unit's flat vector, and so is its per-element optimizer state
// (fsdp/full_state_view.h): a parameter's piece in rank r's shard is the overlap of [offset, offset + numel) with
// [r S, (r + 1) S), and the same overlap of each state field. The padding is not stored; it is zero, as the
// padding's values and state always are.
//
// Memory: a rank holds its shards and, while it reads one unit, the pieces of that unit that overlap its shard
// (whole pieces, to check their checksums): at most the unit, the largest of which fsdp gathers anyway. They sit
// in checkpoint/, above fsdp/: a checkpoint format knows fsdp's shards, fsdp knows no checkpoint format.
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <string>

#include "tandem/checkpoint/checkpoint.h"
#include "tandem/fsdp/sharded_model.h"

namespace tandem::checkpoint {

// Every rank, no communication: this rank's file of the checkpoint at `path`. A parameter that `module` registers
// under several names (a tied weight) is written under each, as a state dict holds it.
void write_fsdp_shard_file(const std::string& path, const fsdp::ShardedModel& model, const torch::nn::Module& module,
                           const torch::optim::Optimizer& optimizer);
// Rank 0, once every rank's file is written: the index, then the checkpoint file itself (which completes it).
// `optimizer` (shard_optimizer's) is pointed at the module's parameters for the moment it is saved.
void write_fsdp_checkpoint_file(const std::string& path, const fsdp::ShardedModel& model, torch::nn::Module& module,
                                torch::optim::Optimizer& optimizer, const CheckpointState& state,
                                const ExtraState& extra);

// Every rank, no communication: this rank's shards and shard state cut from the sharded checkpoint at `path`,
// whatever world size wrote it, with the model's buffers; fills `extra` when given. Throws InvalidArgument in
// one line as load_checkpoint does, naming the part of the checkpoint that is missing or damaged.
CheckpointState load_fsdp_sharded_checkpoint(const std::string& path, fsdp::ShardedModel& model,
                                             torch::nn::Module& module, torch::optim::Optimizer& optimizer,
                                             ExtraState* extra);

}  // namespace tandem::checkpoint
