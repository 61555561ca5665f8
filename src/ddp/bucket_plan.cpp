#include "bucket_plan.h"

#include <ATen/Parallel.h>
#include <torch/torch.h>

#include "tandem/comm/rank_layout.h"
#include "tandem/comm/value_collectives.h"

namespace tandem::ddp {
namespace {

constexpr double kBytesPerMb = 1024.0 * 1024.0;
// A cap no model reaches: one bucket per dtype.
constexpr double kOneBucketMb = 1024.0 * 1024.0;

// Whether this host's ranks' compute threads take every core this process may run on, leaving none for the
// backend's communication threads.
bool host_cores_taken_by_ranks() {
  const int local_ranks = comm::detect_rank_layout().local_world_size;
  return ranks_fill_cores(local_ranks, at::get_num_threads(), usable_cores());
}

}  // namespace

std::vector<BucketLayout> plan_buckets(const DdpOptions& options, const std::vector<torch::Tensor>& trainable,
                                       const std::vector<size_t>* walk_order) {
  const auto first_cap = static_cast<int64_t>(options.first_bucket_cap_mb * kBytesPerMb);
  const auto cap = static_cast<int64_t>(options.bucket_cap_mb * kBytesPerMb);
  return walk_order ? assign_buckets(trainable, *walk_order, first_cap, cap) : assign_buckets(trainable, first_cap, cap);
}

bool adapt_caps_to_host(DdpOptions& options, comm::Communicator& communicator) {
  if (options.bucket_plan != BucketPlan::kAdaptToHost || !communicator.device().is_cpu()) return false;
  torch::Tensor one_bucket = torch::tensor({host_cores_taken_by_ranks() ? int64_t{1} : int64_t{0}});
  comm::broadcast_values(communicator, one_bucket, 0);
  if (one_bucket.item<int64_t>() == 0) return false;
  options.first_bucket_cap_mb = options.bucket_cap_mb = kOneBucketMb;
  return true;
}

}  // namespace tandem::ddp
