#include "tandem/data/image_transform.h"

#include <algorithm>
#include <cmath>

#include "tandem/data/image_resample.h"
#include "tandem/util/error.h"

namespace tandem::data {
namespace {

// torchvision's RandomResizedCrop.get_params: ten tries at a random area and aspect ratio, else a center crop
// with the aspect ratio clamped.
ImageRegion random_resized_crop(int width, int height, const ImageTransformOptions& t, SeededRandom& random) {
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
ImageRegion center_crop(int width, int height, const ImageTransformOptions& t) {
  const double resized_short = std::max<double>(1.0, std::round(t.image_size * t.resize_ratio));
  const double scale = resized_short / std::min(width, height);  // resized pixels per source pixel
  const double w = std::min<double>(width, t.image_size / scale);
  const double h = std::min<double>(height, t.image_size / scale);
  return {(width - w) / 2, (height - h) / 2, w, h};
}

}  // namespace

void check_image_transform_options(const ImageTransformOptions& options) {
  if (options.image_size < 1) throw InvalidArgument("image_size must be at least 1");
  if (!(options.min_crop_scale > 0 && options.min_crop_scale <= options.max_crop_scale &&
        options.max_crop_scale <= 1)) {
    throw InvalidArgument("crop scale range must satisfy 0 < min <= max <= 1");
  }
}

CropPlan plan_crop(int width, int height, const ImageTransformOptions& options, SeededRandom& random) {
  const ImageRegion region = options.train ? random_resized_crop(width, height, options, random)
                                           : center_crop(width, height, options);
  const bool flip = options.train && options.horizontal_flip && (random.next() & 1);
  return {region.x0, region.y0, region.width, region.height, flip};
}

int dct_reduction(const CropPlan& crop, int64_t image_size) {
  int reduction = 1;
  while (reduction < 8 && std::min(crop.width, crop.height) >= 2.0 * reduction * image_size) reduction *= 2;
  return reduction;
}

void render_crop(const Image& image, int full_width, int full_height, const CropPlan& crop,
                 const ImageTransformOptions& options, float* out) {
  // A reduced JPEG is ceil(full / reduction) pixels across, so the scale is the ratio of the sizes themselves.
  const double scale_x = static_cast<double>(image.width) / full_width;
  const double scale_y = static_cast<double>(image.height) / full_height;
  const ImageRegion region{crop.x0 * scale_x, crop.y0 * scale_y, crop.width * scale_x, crop.height * scale_y};
  resample_region(image, region, {static_cast<int>(options.image_size), crop.flip, options.mean, options.std}, out);
}

void transform_image(const Image& image, const ImageTransformOptions& options, SeededRandom& random, float* out) {
  render_crop(image, image.width, image.height, plan_crop(image.width, image.height, options, random), options, out);
}

}  // namespace tandem::data
