#pragma once
// How far apart two trained models are: the relative L2 distance over every floating tensor of two weight sets
// (safetensors files, PyTorch names), the measure the parity tests' tolerances are stated in.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "tandem/checkpoint/safetensors.h"

namespace tandem::testing {

// ||actual - expected|| / ||expected|| over every floating tensor of `expected`; a tensor that `actual` lacks or
// holds in another shape fails the calling test and makes the distance infinite.
inline double weights_relative_l2(const checkpoint::TensorFile& expected, const checkpoint::TensorFile& actual) {
  EXPECT_EQ(expected.tensors.size(), actual.tensors.size());
  double difference = 0, norm = 0;
  for (const auto& [name, tensor] : expected.tensors) {
    const torch::Tensor other = actual.find(name);
    if (!other.defined() || other.sizes() != tensor.sizes()) {
      ADD_FAILURE() << name << " is missing or of another shape";
      return std::numeric_limits<double>::infinity();
    }
    if (!tensor.is_floating_point()) continue;
    difference += (tensor.to(torch::kDouble) - other.to(torch::kDouble)).pow(2).sum().item<double>();
    norm += tensor.to(torch::kDouble).pow(2).sum().item<double>();
  }
  return std::sqrt(difference / norm);
}

inline double weights_relative_l2(const std::string& expected_path, const std::string& actual_path) {
  return weights_relative_l2(checkpoint::load_safetensors(expected_path), checkpoint::load_safetensors(actual_path));
}

}  // namespace tandem::testing
