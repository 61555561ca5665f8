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
// Every rank's string, on every rank; each is cut to its first `max_bytes`.
std::vector<std::string> all_gather_strings(Communicator& communicator, const std::string& value,
                                            size_t max_bytes = 256);

// "ranks [0, 2] have A; ranks [1] have B": ranks grouped by their value, in the order values first appear. For
// errors that every rank raises alike after an exchange, naming who differs.
std::string describe_rank_groups(const std::vector<std::string>& value_per_rank);

}  // namespace tandem::comm
