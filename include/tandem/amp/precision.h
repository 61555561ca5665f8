#pragma once
// The precision a run trains in, with Lightning's spellings (`tandem train --precision`):
//   32          float32 throughout
//   bf16-mixed  autocast to bfloat16; float32 weights, gradients and optimizer state; no loss scaling (bfloat16
//               has float32's range)
//   16-mixed    autocast to float16, with a GradScaler (grad_scaler.h) against gradients that underflow
//               float16's range
#include <torch/types.h>

#include <optional>
#include <string>

#include "tandem/util/error.h"

namespace tandem::amp {

enum class Precision { kFloat32, kBf16Mixed, kFloat16Mixed };

inline std::string to_string(Precision precision) {
  switch (precision) {
    case Precision::kBf16Mixed: return "bf16-mixed";
    case Precision::kFloat16Mixed: return "16-mixed";
    case Precision::kFloat32: break;
  }
  return "32";
}

// Throws InvalidArgument naming the three spellings.
inline Precision parse_precision(const std::string& name) {
  for (Precision precision : {Precision::kFloat32, Precision::kBf16Mixed, Precision::kFloat16Mixed}) {
    if (name == to_string(precision)) return precision;
  }
  throw InvalidArgument("precision '" + name + "' is not one of 32, bf16-mixed, 16-mixed");
}

// The dtype autocast runs eligible operations in; none for 32.
inline std::optional<torch::ScalarType> autocast_dtype(Precision precision) {
  switch (precision) {
    case Precision::kBf16Mixed: return torch::kBFloat16;
    case Precision::kFloat16Mixed: return torch::kHalf;
    case Precision::kFloat32: break;
  }
  return std::nullopt;
}

inline bool uses_loss_scaling(Precision precision) { return precision == Precision::kFloat16Mixed; }

}  // namespace tandem::amp
