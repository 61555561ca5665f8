#include "tandem/optim/parameter_partition.h"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>

#include "tandem/util/error.h"

namespace tandem::optim {

ParameterPartition partition_parameters(const std::vector<torch::Tensor>& parameters, int world_size) {
  if (world_size < 1) throw InvalidArgument(fmt::format("a partition needs at least one rank, not {}", world_size));
  std::vector<int64_t> bytes;
  for (const auto& parameter : parameters) bytes.push_back(parameter.numel() * parameter.element_size());
  std::vector<size_t> largest_first(parameters.size());
  std::iota(largest_first.begin(), largest_first.end(), size_t{0});
  std::stable_sort(largest_first.begin(), largest_first.end(), [&](size_t a, size_t b) { return bytes[a] > bytes[b]; });

  ParameterPartition partition{std::vector<int>(parameters.size(), 0), std::vector<int64_t>(world_size, 0)};
  for (size_t index : largest_first) {
    // min_element returns the first of equals: the lowest rank.
    const auto least_loaded = std::min_element(partition.rank_bytes.begin(), partition.rank_bytes.end());
    partition.owner[index] = static_cast<int>(least_loaded - partition.rank_bytes.begin());
    *least_loaded += bytes[index];
  }
  return partition;
}

}  // namespace tandem::optim
