#pragma once
// How much memory an optimizer's per-parameter state takes: what ZeroRedundancyOptimizer divides among the ranks.
#include <torch/optim/optimizer.h>

#include <cstdint>

namespace tandem::optim {

// The bytes of every tensor in `optimizer`'s per-parameter state (SGD's momentum buffers, Adam's moments and step
// counts, ...), found through each state's own serialize(), so any optimizer is measured alike. Costs a
// serialization of the state: for reports, not for every step.
int64_t optimizer_state_bytes(const torch::optim::Optimizer& optimizer);

}  // namespace tandem::optim
