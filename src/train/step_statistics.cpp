#include "step_statistics.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>

#include "tandem/comm/value_collectives.h"
#include "tandem/train/loop.h"

namespace tandem::train {

// Built on the loss's device as [loss sum, trained ranks, samples, a non-finite flag per rank, seconds per rank,
// the announced membership], so the step costs one all-reduce and one read for the metric, the NaN check, the
// throughput, the ranks' timings and a change of membership.
StepStatistics reduce_step_statistics(const torch::Tensor& loss, int64_t samples, double seconds, int rank,
                                      comm::Communicator* communicator, int64_t announced_membership) {
  const int world = communicator ? communicator->world_size() : 1;
  const torch::TensorOptions options =
      torch::TensorOptions().dtype(torch::kFloat64).device(loss.defined() ? loss.device() : torch::kCPU);
  torch::Tensor stats = torch::zeros({4 + 2 * world}, options);
  if (loss.defined()) {
    torch::Tensor value = loss.detach().to(torch::kFloat64).reshape({1});
    torch::Tensor finite = torch::isfinite(value);
    stats.narrow(0, 0, 1).copy_(torch::where(finite, value, torch::zeros_like(value)));
    stats.narrow(0, 1, 1).fill_(1.0);
    stats.narrow(0, 3 + rank, 1).copy_(finite.logical_not().to(torch::kFloat64));
  }
  stats.narrow(0, 2, 1).fill_(static_cast<double>(samples));
  stats.narrow(0, 3 + world + rank, 1).fill_(seconds);
  stats.narrow(0, 3 + 2 * world, 1).fill_(static_cast<double>(announced_membership));
  if (world > 1) comm::all_reduce_values(*communicator, stats, comm::ReduceOp::Sum);
  const torch::Tensor host = stats.cpu();
  const double* values = host.data_ptr<double>();
  StepStatistics result;
  result.loss_sum = values[0];
  result.trained_ranks = static_cast<int>(std::lround(values[1]));
  result.samples = std::llround(values[2]);
  for (int r = 0; r < world; ++r) {
    if (values[3 + r] > 0) result.nonfinite_ranks.push_back(r);
    result.rank_seconds.push_back(values[3 + world + r]);
  }
  result.announced_membership = std::llround(values[3 + 2 * world]);
  return result;
}

void throw_nonfinite(const StepStatistics& stats, int64_t step, int epoch, int64_t batch_index) {
  throw NonFiniteLossError(fmt::format(
      "non-finite loss on rank{} {} at step {} (epoch {}, batch {}); stopping all ranks. Try a lower `lr`.",
      stats.nonfinite_ranks.size() > 1 ? "s" : "", fmt::join(stats.nonfinite_ranks, ","), step, epoch, batch_index));
}

}  // namespace tandem::train
