#pragma once
// Checks every collective of a Communicator against values computed by hand. Shared by each backend's tests
// (gloo in tests/comm, mpi in tests/mpi) so that every backend passes the very same checks.
#include <torch/types.h>

#include "tandem/comm/communicator.h"

namespace tandem::testing {

// Rank r holds r+1+i*0.5 at element i: distinct per rank and element, exact in float32 for these sizes.
torch::Tensor rank_values(int rank, int64_t numel, torch::ScalarType dtype);

// Runs all_reduce (sum, avg, min, max), broadcast (from the first and last rank), all_gather, reduce_scatter
// and barrier on `numel` elements of `dtype` held on `device`, and records a gtest failure for every wrong result.
void check_all_collectives(int rank, comm::Communicator& comm, int64_t numel, torch::ScalarType dtype,
                           const torch::Device& device = torch::kCPU);

// Averages at the edges: float32 values near the top of the range average without overflowing (divided
// before the sum), and an integer average reports completion only once the tensor holds the average.
void check_average_edges(int rank, comm::Communicator& comm);

// What the communicator base emulates for backends that lack it, over a real backend: complex sums and averages
// (sent as real pairs), integer averages (truncated), averaging reduce-scatters, and complex broadcast and
// all_gather.
void check_emulated_reductions(int rank, comm::Communicator& comm);

}  // namespace tandem::testing
