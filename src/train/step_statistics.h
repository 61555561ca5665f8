#pragma once
// What each optimizer step's one all-reduce tells every rank, read on the host: the loss for the metric, the
// ranks whose loss was not finite, the samples trained on and every rank's time. Internal to the loop.
#include <torch/types.h>

#include <cstdint>
#include <vector>

#include "tandem/comm/communicator.h"

namespace tandem::train {

struct StepStatistics {
  double loss_sum = 0;            // of the finite losses
  int trained_ranks = 0;          // fewer than the world when some ranks ran out of data (uneven inputs)
  int64_t samples = 0;            // in this step's batches over every rank: partial batches count what they hold
  std::vector<int> nonfinite_ranks;
  std::vector<double> rank_seconds;
  // Under in-job recovery, the newest membership epoch rank 0 found published before the step: every rank learns
  // it from the same all-reduce, so all change membership after the same step.
  int64_t announced_membership = 0;

  double mean_loss() const { return trained_ranks > 0 ? loss_sum / trained_ranks : 0.0; }
};

// Collective. A rank that shadows the step (it has no loss) passes an undefined `loss` and no samples.
// `announced_membership`: rank 0's newest published membership epoch (0 elsewhere, and without in-job recovery).
StepStatistics reduce_step_statistics(const torch::Tensor& loss, int64_t samples, double seconds, int rank,
                                      comm::Communicator* communicator, int64_t announced_membership = 0);

// Throws NonFiniteLossError (train/loop.h) naming the ranks whose loss was not finite, on every rank alike.
[[noreturn]] void throw_nonfinite(const StepStatistics& stats, int64_t step, int epoch, int64_t batch_index);

}  // namespace tandem::train
