#pragma once
// Blocking collectives on small values (flags, counts, losses, strings) through any backend. A tensor that is
// not on the backend's device (a CPU flag under nccl, a GPU loss under gloo) is copied there for the
// collective and the result copied back, so callers keep their values where they compute them.
#include <string>
#include <vector>

#include "tandem/comm/communicator.h"

namespace tandem::comm {

// In place, on `values`' own device.
void all_reduce_values(Communicator& communicator, torch::Tensor& values, ReduceOp op);
void broadcast_values(Communicator& communicator, torch::Tensor& values, int root);
// One tensor per rank, on the CPU (these are read on the host).
std::vector<torch::Tensor> all_gather_values(Communicator& communicator, const torch::Tensor& values);
// Rank `root`'s string on every rank.
std::string broadcast_string(Communicator& communicator, const std::string& value, int root = 0);

}  // namespace tandem::comm
