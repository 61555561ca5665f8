#pragma once
// Which parameters share a gradient bucket. Buckets are formed walking the parameters in reverse
// registration order (roughly the order backward produces their gradients) or in a given order, one open bucket per
// (dtype, device), closing a bucket once it holds at least its cap in bytes: the first bucket of each
// dtype uses first_bucket_cap_bytes, later ones bucket_cap_bytes. Each bucket becomes one flat buffer.
#include <torch/types.h>

#include <cstdint>
#include <vector>

namespace tandem::ddp {

struct BucketLayout {
  // Indices into the list given to assign_buckets, in the order they lie in the flat buffer.
  std::vector<size_t> params;
  // Element offset of each parameter in the flat buffer, parallel to `params`.
  std::vector<int64_t> offsets;
  int64_t numel = 0;
  torch::ScalarType dtype = torch::kFloat;
  torch::Device device = torch::kCPU;
};

// Buckets in launch order: bucket 0 holds the last-registered parameters. Every rank computes the same
// layout from the same model, which keeps the all-reduces matched across ranks.
std::vector<BucketLayout> assign_buckets(const std::vector<torch::Tensor>& params, int64_t first_bucket_cap_bytes,
                                         int64_t bucket_cap_bytes);

// The same, walking only the parameters in `walk_order` (indices into `params`), in that order: the order in
// which backward actually produced their gradients, once it is known (the reducer's rebuild).
std::vector<BucketLayout> assign_buckets(const std::vector<torch::Tensor>& params, const std::vector<size_t>& walk_order,
                                         int64_t first_bucket_cap_bytes, int64_t bucket_cap_bytes);

// True when `local_ranks` processes of `threads_per_rank` compute threads each take all `cores`: collectives
// that run on the host then have no core to overlap backward on (BucketPlan::kAdaptToHost).
bool ranks_fill_cores(int local_ranks, int threads_per_rank, int cores);
// The cores this process may run on (its CPU affinity), at least 1.
int usable_cores();

}  // namespace tandem::ddp
