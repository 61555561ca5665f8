#include "tandem/data/image_transform.h"

#include <stb/stb_image_resize.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "tandem/util/error.h"

namespace tandem::data {
namespace {

// A crop of the source image in pixel coordinates (fractional: resizing samples it exactly).
struct Region {
  double x0, y0, width, height;
};

// torchvision's RandomResizedCrop.get_params: ten tries at a random area and aspect ratio, else a center crop
// with the aspect ratio clamped.
Region random_resized_crop(int width, int height, const ImageTransformOptions& t, SeededRandom& random) {
  const double area = static_cast<double>(width) * height;
  const double log_low = std::log(3.0 / 4.0), log_high = std::log(4.0 / 3.0);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target_area = area * random.uniform(t.min_crop_scale, t.max_crop_scale);
    const double aspect = std::exp(random.uniform(log_low, log_high));
    const int64_t w = std::llround(std::sqrt(target_area * aspect));
    const int64_t h = std::llround(std::sqrt(target_area / aspect));
    if (w > 0 && h > 0 && w <= width && h <= height) {
      const int64_t y = random.below(height - h + 1), x = random.below(width - w + 1);
      return {static_cast<double>(x), static_cast<double>(y), static_cast<double>(w), static_cast<double>(h)};
    }
  }
  const double ratio = static_cast<double>(width) / height;
  double w = width, h = height;
  if (ratio < 3.0 / 4.0) {
    h = std::round(w / (3.0 / 4.0));
  } else if (ratio > 4.0 / 3.0) {
    w = std::round(h * (4.0 / 3.0));
  }
  return {(width - w) / 2, (height - h) / 2, w, h};
}

// Resize(shorter side -> image_size * resize_ratio) then CenterCrop(image_size), as one region of the source.
Region center_crop(int width, int height, const ImageTransformOptions& t) {
  const double resized_short = std::max<double>(1.0, std::round(t.image_size * t.resize_ratio));
  const double scale = resized_short / std::min(width, height);  // resized pixels per source pixel
  const double w = std::min<double>(width, t.image_size / scale);
  const double h = std::min<double>(height, t.image_size / scale);
  return {(width - w) / 2, (height - h) / 2, w, h};
}

// `region` of `image` resampled to size x size RGB bytes. Resizing the region directly, rather than cropping
// then resizing, samples fractional crop edges exactly.
std::vector<uint8_t> resize_region(const Image& image, const Region& region, int size) {
  std::vector<uint8_t> resized(static_cast<size_t>(size) * size * 3);
  // Triangle filter in linear space: bilinear, widened when shrinking (PIL's antialiased bilinear).
  const int ok = stbir_resize_region(
      image.pixels.data(), image.width, image.height, 0, resized.data(), size, size, 0, STBIR_TYPE_UINT8, 3,
      STBIR_ALPHA_CHANNEL_NONE, 0, STBIR_EDGE_CLAMP, STBIR_EDGE_CLAMP, STBIR_FILTER_TRIANGLE, STBIR_FILTER_TRIANGLE,
      STBIR_COLORSPACE_LINEAR, nullptr, region.x0 / image.width, region.y0 / image.height,
      (region.x0 + region.width) / image.width, (region.y0 + region.height) / image.height);
  TANDEM_CHECK(ok, "stbir_resize_region failed resizing a ", image.width, "x", image.height, " image to ", size);
  return resized;
}

// HWC bytes to normalised CHW floats, mirrored left to right when `flip`.
void normalize_into(const std::vector<uint8_t>& resized, int size, bool flip, const ImageTransformOptions& t,
                    float* out) {
  const int64_t plane = static_cast<int64_t>(size) * size;
  for (int c = 0; c < 3; ++c) {
    const float scale = 1.0f / (255.0f * t.std[c]), shift = -t.mean[c] / t.std[c];
    float* dst = out + c * plane;
    for (int y = 0; y < size; ++y) {
      for (int x = 0; x < size; ++x) {
        const int src_x = flip ? size - 1 - x : x;
        dst[y * size + x] = resized[(static_cast<size_t>(y) * size + src_x) * 3 + c] * scale + shift;
      }
    }
  }
}

}  // namespace

void check_image_transform_options(const ImageTransformOptions& options) {
  if (options.image_size < 1) throw InvalidArgument("image_size must be at least 1");
  if (!(options.min_crop_scale > 0 && options.min_crop_scale <= options.max_crop_scale &&
        options.max_crop_scale <= 1)) {
    throw InvalidArgument("crop scale range must satisfy 0 < min <= max <= 1");
  }
}

void transform_image(const Image& image, const ImageTransformOptions& options, SeededRandom& random, float* out) {
  const Region region = options.train ? random_resized_crop(image.width, image.height, options, random)
                                      : center_crop(image.width, image.height, options);
  const bool flip = options.train && options.horizontal_flip && (random.next() & 1);
  const int size = static_cast<int>(options.image_size);
  normalize_into(resize_region(image, region, size), size, flip, options, out);
}

}  // namespace tandem::data
