#include "tandem/data/crop_defaults.h"

#include <algorithm>

namespace tandem::data {

double default_min_crop_scale(int64_t image_size) {
  const double side = static_cast<double>(std::max<int64_t>(1, image_size));
  return std::clamp(0.08 * (224.0 / side) * (224.0 / side), 0.08, 1.0);
}

double default_val_resize_ratio(int64_t image_size) {
  constexpr double kTorchvision = 256.0 / 224.0;
  return 1.0 + (kTorchvision - 1.0) * std::min(1.0, static_cast<double>(image_size) / 224.0);
}

}  // namespace tandem::data
