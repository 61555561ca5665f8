#pragma once
// How the reducer applies DdpOptions' bucket caps and BucketPlan (ddp_options.h) to assign_buckets (bucket.h).
//
// Private to the reducer.
#include <torch/types.h>

#include <vector>

#include "tandem/comm/communicator.h"
#include "tandem/ddp/bucket.h"
#include "tandem/ddp/ddp_options.h"

namespace tandem::ddp {

// The buckets of `trainable` under the options' caps: in reverse registration order, or in `walk_order` where
// given.
std::vector<BucketLayout> plan_buckets(const DdpOptions& options, const std::vector<torch::Tensor>& trainable,
                                       const std::vector<size_t>* walk_order);

// Collective under BucketPlan::kAdaptToHost with a backend whose collectives run on the host: when rank 0's
// host's ranks take every core, raises the caps so that every gradient goes in one bucket per dtype, on every
// rank alike. Returns whether it changed them.
bool adapt_caps_to_host(DdpOptions& options, comm::Communicator& communicator);

}  // namespace tandem::ddp
