#pragma once
// What the image folder does to a decoded image before the model sees it: torchvision's ImageNet transforms
// (RandomResizedCrop + RandomHorizontalFlip for training, Resize + CenterCrop for validation), then
// normalisation into a float CHW tensor.
#include <array>
#include <cstdint>

#include "tandem/data/image.h"
#include "tandem/data/seeded_random.h"

namespace tandem::data {

struct ImageTransformOptions {
  // Output images are [3, image_size, image_size].
  int64_t image_size = 224;
  // Training: random resized crop (area fraction in [min_crop_scale, max_crop_scale] of the image, aspect ratio
  // in [3/4, 4/3]) then a random horizontal flip, as torchvision's RandomResizedCrop + RandomHorizontalFlip.
  // Validation (train = false): resize the shorter side to image_size * resize_ratio, then center-crop
  // image_size (torchvision's Resize(256) + CenterCrop(224) for the default ratio).
  bool train = false;
  double min_crop_scale = 0.08;
  double max_crop_scale = 1.0;
  bool horizontal_flip = true;
  double resize_ratio = 256.0 / 224.0;
  // ImageNet normalisation, per RGB channel, applied to values in [0, 1].
  std::array<float, 3> mean = {0.485f, 0.456f, 0.406f};
  std::array<float, 3> std = {0.229f, 0.224f, 0.225f};
};

// Throws InvalidArgument unless image_size >= 1 and 0 < min_crop_scale <= max_crop_scale <= 1.
void check_image_transform_options(const ImageTransformOptions& options);

// The part of an image the transform keeps, in the full-size image's pixels (fractional: resizing samples it
// exactly), and whether it is mirrored.
struct CropPlan {
  double x0 = 0, y0 = 0, width = 0, height = 0;
  bool flip = false;
};

// The crop and flip for an image of the declared width x height. Training crops and flips are drawn from
// `random`, in that order, so that the same generator state always gives the same crop; validation draws
// nothing. Knowing the crop before decoding lets a JPEG be decoded at a reduced size (dct_reduction) while the
// crop is still drawn on the full-size image, so the augmentation's distribution is torchvision's either way.
CropPlan plan_crop(int width, int height, const ImageTransformOptions& options, SeededRandom& random);

// The largest of 1, 2, 4 and 8 such that both sides of the crop are at least that many times image_size: a
// JPEG decoded that many times smaller still has at least as many pixels across the crop as the output.
int dct_reduction(const CropPlan& crop, int64_t image_size);

// Writes `crop` of an image declared full_width x full_height into `out` (3 * image_size^2 floats,
// channel-major), resampled from `image`, which is that image decoded at full or reduced size: the crop is
// scaled onto it.
void render_crop(const Image& image, int full_width, int full_height, const CropPlan& crop,
                 const ImageTransformOptions& options, float* out);

// plan_crop on the image's own size, then render_crop: the same result bit for bit as that pair.
void transform_image(const Image& image, const ImageTransformOptions& options, SeededRandom& random, float* out);

}  // namespace tandem::data
