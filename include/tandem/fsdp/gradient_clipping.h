#pragma once
// Clipping by the global norm when every rank holds only a shard of each gradient.
#include "tandem/fsdp/sharded_model.h"

namespace tandem::fsdp {

// Collective. The 2-norm of the whole gradient (every unit, all ranks: the shards' squared sums all-reduced,
// the padding counting zero) and, where it exceeds max_norm, every shard gradient scaled by
// max_norm / (norm + 1e-6), as torch.nn.utils.clip_grad_norm_ scales the full one. Returns the norm before
// clipping. Call after backward, before the optimizer steps.
double clip_grad_norm(ShardedModel& model, double max_norm);

}  // namespace tandem::fsdp
