#include "tandem/ddp/bucket.h"

#include <sched.h>

#include <algorithm>
#include <thread>
#include <map>
#include <string>
#include <utility>

namespace tandem::ddp {

std::vector<BucketLayout> assign_buckets(const std::vector<torch::Tensor>& params, int64_t first_bucket_cap_bytes,
                                         int64_t bucket_cap_bytes) {
  std::vector<size_t> reverse_registration(params.size());
  for (size_t i = 0; i < params.size(); ++i) reverse_registration[i] = params.size() - 1 - i;
  return assign_buckets(params, reverse_registration, first_bucket_cap_bytes, bucket_cap_bytes);
}

std::vector<BucketLayout> assign_buckets(const std::vector<torch::Tensor>& params, const std::vector<size_t>& walk_order,
                                         int64_t first_bucket_cap_bytes, int64_t bucket_cap_bytes) {
  struct Open {
    BucketLayout layout;
    int64_t bytes = 0;
    size_t closed = 0;  // buckets already closed for this (dtype, device): picks the cap
    size_t first_seen = 0;  // position of its first parameter in the walk, to order the result
  };
  // std::map keyed by (dtype, device) strings is fine: this runs once per model.
  std::map<std::pair<int, std::string>, Open> open;
  std::vector<std::pair<size_t, BucketLayout>> done;
  size_t position = 0;
  for (; position < walk_order.size(); ++position) {
    const size_t i = walk_order[position];
    const torch::Tensor& param = params[i];
    auto key = std::make_pair(static_cast<int>(param.scalar_type()), param.device().str());
    Open& bucket = open[key];
    if (bucket.layout.params.empty()) {
      bucket.layout.dtype = param.scalar_type();
      bucket.layout.device = param.device();
      bucket.first_seen = position;
    }
    bucket.layout.params.push_back(i);
    bucket.layout.offsets.push_back(bucket.layout.numel);
    bucket.layout.numel += param.numel();
    bucket.bytes += param.numel() * static_cast<int64_t>(param.element_size());
    const int64_t cap = bucket.closed == 0 ? first_bucket_cap_bytes : bucket_cap_bytes;
    if (bucket.bytes >= cap) {
      done.emplace_back(bucket.first_seen, std::move(bucket.layout));
      const size_t closed = bucket.closed + 1;
      bucket = Open{};
      bucket.closed = closed;
    }
  }
  for (auto& [key, bucket] : open) {
    if (!bucket.layout.params.empty()) done.emplace_back(bucket.first_seen, std::move(bucket.layout));
  }
  std::stable_sort(done.begin(), done.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<BucketLayout> result;
  result.reserve(done.size());
  for (auto& entry : done) result.push_back(std::move(entry.second));
  return result;
}

bool ranks_fill_cores(int local_ranks, int threads_per_rank, int cores) {
  return int64_t{local_ranks} * threads_per_rank >= cores;
}

int usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

}  // namespace tandem::ddp
