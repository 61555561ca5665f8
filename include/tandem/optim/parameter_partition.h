#pragma once
// Which rank owns which parameter under ZeroRedundancyOptimizer. A parameter stays whole on one rank (its
// optimizer state is never split), and the ranks' shares are balanced by bytes with the greedy rule of
// PyTorch's ZeroRedundancyOptimizer: largest parameter first, each to the rank that owns the fewest bytes so far.
// Ties go to the earlier parameter and the lower rank, so every rank that sees the same shapes computes the same
// partition without talking to the others.
#include <torch/types.h>

#include <cstdint>
#include <vector>

namespace tandem::optim {

struct ParameterPartition {
  std::vector<int> owner;           // per parameter, in the order given
  std::vector<int64_t> rank_bytes;  // per rank: the bytes of the parameters it owns
};

// Throws InvalidArgument unless world_size >= 1.
ParameterPartition partition_parameters(const std::vector<torch::Tensor>& parameters, int world_size);

}  // namespace tandem::optim
