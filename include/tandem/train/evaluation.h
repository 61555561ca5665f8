#pragma once
// Classification accuracy over a test set sharded across ranks, each test sample counted exactly once.
#include <cstdint>
#include <functional>

#include "tandem/comm/communicator.h"
#include "tandem/data/batch_loader.h"

namespace tandem::train {

// Correct predictions and samples counted over all ranks' shards of a test set.
struct EvalCounts {
  int64_t correct = 0;
  int64_t total = 0;
  double accuracy() const { return total > 0 ? static_cast<double>(correct) / total : 0.0; }
};

// Evaluates `forward` (images -> logits) on `loader`'s epoch `epoch` under NoGradGuard, counting only the real
// rows of each batch (DistributedSampler padding excluded), then sums the counts over the ranks, so every test
// sample counts exactly once whatever the world size. Collective: all ranks call it together.
EvalCounts evaluate(const std::function<torch::Tensor(const torch::Tensor&)>& forward, data::BatchLoader& loader,
                    int64_t epoch, comm::Communicator* communicator);

}  // namespace tandem::train
