#pragma once
// Parameters that got no gradient in a step are not stepped, as in plain training, DDP and FSDP2.
//
// At the end of each synchronising backward the ranks agree (one all-reduce of a flag per parameter, as DDP's
// unused-parameter search) which parameters got a gradient on some rank. A unit none of whose parameters got one
// leaves its shard's gradient as it was, undefined after zero_grad(set_to_none), and the optimizer skips the shard
// as it skips such a parameter. A unit that shares its flat shard between used and unused parameters cannot be
// skipped in part by a LibTorch optimizer: momentum, weight decay and Adam's moments would move the unused
// elements on a zero gradient. step_leaving_unused() brackets the step instead: it keeps those elements' values
// and their per-element optimizer state from before the step and puts them back after it. docs/fsdp.md, "Parameters
// without a gradient".
#include <torch/optim/optimizer.h>

#include <functional>

#include "tandem/fsdp/sharded_model.h"

namespace tandem::fsdp {

// Runs `step` (optimizer.step(), or a GradScaler's step of it) over `model`'s shards, leaving the elements of
// model.unused_elements() and their state in `optimizer` as they were. Any optimizer: the per-element state is
// found through each state's own serialize(), as a tensor of the shard's size. A state the step created for such
// elements starts at zero, what a fresh state holds.
void step_leaving_unused(ShardedModel& model, torch::optim::Optimizer& optimizer, const std::function<void()>& step);

}  // namespace tandem::fsdp
