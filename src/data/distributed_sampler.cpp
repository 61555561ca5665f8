#include "tandem/data/distributed_sampler.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <algorithm>

#include "tandem/util/error.h"

namespace tandem::data {

DistributedSampler::DistributedSampler(int64_t dataset_size, DistributedSamplerOptions options)
    : dataset_size_(dataset_size), options_(options) {
  const int64_t world = options_.num_replicas;
  if (dataset_size < 0) {
    throw InvalidArgument(detail::concat("DistributedSampler: dataset size must be >= 0, got ", dataset_size));
  }
  if (world < 1) {
    throw InvalidArgument(detail::concat("DistributedSampler: num_replicas must be >= 1, got ", world));
  }
  if (options_.rank < 0 || options_.rank >= world) {
    throw InvalidArgument(detail::concat("DistributedSampler: rank ", options_.rank, " is outside [0, ", world - 1,
                                         "] for num_replicas ", world));
  }
  if (options_.drop_last && options_.uneven) {
    throw InvalidArgument("DistributedSampler: drop_last and uneven exclude each other (uneven keeps every sample)");
  }
  count_samples();
}

void DistributedSampler::count_samples() {
  const int64_t world = options_.num_replicas;
  const int64_t remaining = dataset_size_ - first_position_;
  // PyTorch: ceil(n / W) with padding; with drop_last and a remainder, ceil((n - W) / W), which is floor(n / W).
  // Rank r's entry j holds global position P + r + j*W, which is real while it is < n.
  const int64_t real_positions = std::max<int64_t>(0, (remaining - options_.rank + world - 1) / world);
  if (options_.uneven) {
    num_samples_ = real_positions;
  } else if (options_.drop_last) {
    num_samples_ = remaining / world;
  } else {
    num_samples_ = (remaining + world - 1) / world;
  }
  real_count_ = std::min(num_samples_, real_positions);
}

void DistributedSampler::set_epoch(int64_t epoch, int64_t first_position) {
  if (first_position < 0 || first_position > dataset_size_) {
    throw InvalidArgument(detail::concat("DistributedSampler: an epoch's first position must be in [0, ",
                                         dataset_size_, "], got ", first_position));
  }
  epoch_ = epoch;
  first_position_ = first_position;
  count_samples();
}

bool DistributedSampler::is_padding(int64_t position) const {
  TANDEM_CHECK(position >= 0 && position < num_samples_, "position ", position, " outside [0, ", num_samples_, ")");
  return position >= real_count_;
}

std::vector<int64_t> DistributedSampler::global_indices() const {
  const int64_t n = dataset_size_;
  std::vector<int64_t> order(static_cast<size_t>(n));
  if (options_.shuffle && n > 0) {
    // A fresh CPU generator per epoch, as PyTorch's sampler does: torch.Generator().manual_seed(seed + epoch).
    at::Generator generator = at::detail::createCPUGenerator(options_.seed + static_cast<uint64_t>(epoch_));
    torch::Tensor perm = torch::randperm(n, generator, torch::TensorOptions().dtype(torch::kLong));
    const int64_t* data = perm.data_ptr<int64_t>();
    std::copy(data, data + n, order.begin());
  } else {
    for (int64_t i = 0; i < n; ++i) order[static_cast<size_t>(i)] = i;
  }
  const int64_t total = total_size();
  std::vector<int64_t> padded(static_cast<size_t>(total));
  // Padding repeats the order from its start, cyclically when it is longer than n; drop_last cuts (total <= n).
  for (int64_t p = 0; p < total; ++p) {
    padded[static_cast<size_t>(p)] = order[static_cast<size_t>((first_position_ + p) % n)];
  }
  return padded;
}

std::vector<int64_t> DistributedSampler::indices() const {
  const std::vector<int64_t> global = global_indices();
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(num_samples_));
  for (int64_t p = options_.rank; p < total_size(); p += options_.num_replicas) {
    mine.push_back(global[static_cast<size_t>(p)]);
  }
  return mine;
}

}  // namespace tandem::data
