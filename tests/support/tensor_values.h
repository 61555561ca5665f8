#pragma once
// A tensor's values as a vector, so that a test compares sample indices and labels with EXPECT_EQ and sees them
// printed when they differ.
#include <torch/types.h>

#include <cstdint>
#include <vector>

namespace tandem::testing {

// The values of an int64 tensor of any shape, in row-major order.
inline std::vector<int64_t> to_vector(const torch::Tensor& t) {
  const torch::Tensor c = t.contiguous();
  return std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

}  // namespace tandem::testing
