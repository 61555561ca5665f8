#pragma once
// Resampling a region of a decoded image straight into the model's input: a square of normalised float CHW
// pixels, mirrored or not. The filter is PIL's antialiased bilinear (a triangle widened by the downscale
// factor, in linear 8-bit values, no gamma), which torchvision's RandomResizedCrop and Resize apply to PIL
// images, run as two separable passes; the normalisation and the flip are folded into the second pass, so no
// intermediate 8-bit image is written.
#include <array>

#include "tandem/data/image.h"

namespace tandem::data {

// A rectangle of an image in its own pixel coordinates; fractional edges are sampled exactly.
struct ImageRegion {
  double x0 = 0, y0 = 0, width = 0, height = 0;
};

struct ResampleTarget {
  int size = 0;        // output is 3 x size x size
  bool flip = false;   // mirror left to right
  std::array<float, 3> mean{};  // per channel, in [0, 1] units: out = (value / 255 - mean) / std
  std::array<float, 3> std{};
};

// Writes `region` of `image`, resampled to target.size x target.size, into `out` (3 * size^2 floats,
// channel-major). Like PIL's resize of a cropped image, the filter reads only the pixels under the region
// (rounded out to whole pixels), so what lies beside a crop never bleeds into it. The region must lie inside
// the image and have a positive size.
void resample_region(const Image& image, const ImageRegion& region, const ResampleTarget& target, float* out);

}  // namespace tandem::data
