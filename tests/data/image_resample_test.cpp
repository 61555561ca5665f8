// The resampler behind the image folder's crops: at scale 1 it copies pixels, the flip mirrors, the
// normalisation is applied per channel, a downscale averages (antialiasing), and a crop never reads the pixels
// beside it.
#include <gtest/gtest.h>

#include <vector>

#include "tandem/data/image_resample.h"

namespace tandem::data::image_resample_test {
namespace {

// width x height RGB, red = x * 10, green = y * 10, blue = 7.
Image gradient(int width, int height) {
  Image image;
  image.width = width;
  image.height = height;
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) image.pixels.insert(image.pixels.end(), {uint8_t(x * 10), uint8_t(y * 10), 7});
  }
  return image;
}

ResampleTarget unnormalised(int size, bool flip = false) { return {size, flip, {0, 0, 0}, {1, 1, 1}}; }

float at(const std::vector<float>& out, int size, int c, int y, int x) { return out[(c * size + y) * size + x]; }

TEST(ImageResample, ScaleOneCopiesAndFlipMirrors) {
  const Image image = gradient(4, 4);
  std::vector<float> out(3 * 16), flipped(3 * 16);
  resample_region(image, {0, 0, 4, 4}, unnormalised(4), out.data());
  resample_region(image, {0, 0, 4, 4}, unnormalised(4, true), flipped.data());
  for (int y = 0; y < 4; ++y) {
    for (int x = 0; x < 4; ++x) {
      EXPECT_FLOAT_EQ(at(out, 4, 0, y, x), x * 10 / 255.0f);
      EXPECT_FLOAT_EQ(at(out, 4, 1, y, x), y * 10 / 255.0f);
      EXPECT_FLOAT_EQ(at(flipped, 4, 0, y, x), (3 - x) * 10 / 255.0f);
    }
  }
}

TEST(ImageResample, NormalisesPerChannel) {
  const Image image = gradient(2, 2);
  std::vector<float> out(3 * 4);
  resample_region(image, {0, 0, 2, 2}, {2, false, {0.1f, 0.2f, 0.3f}, {0.5f, 0.25f, 2.0f}}, out.data());
  EXPECT_FLOAT_EQ(at(out, 2, 2, 0, 0), (7 / 255.0f - 0.3f) / 2.0f);
  EXPECT_FLOAT_EQ(at(out, 2, 1, 1, 0), (10 / 255.0f - 0.2f) / 0.25f);
}

TEST(ImageResample, DownscaleAveragesAndCropsReadOnlyTheirPixels) {
  // Halving a linear ramp gives the means of pixel pairs: (0 + 10) / 2, (20 + 30) / 2 ... away from the edges,
  // where the widened triangle also reaches the neighbours (weights 1/8, 3/8, 3/8, 1/8 in PIL's filter).
  const Image image = gradient(8, 8);
  std::vector<float> out(3 * 16);
  resample_region(image, {0, 0, 8, 8}, unnormalised(4), out.data());
  EXPECT_NEAR(at(out, 4, 0, 0, 1) * 255, 25.0f, 1e-3);
  EXPECT_NEAR(at(out, 4, 0, 0, 2) * 255, 45.0f, 1e-3);
  // A crop of columns 4..7 at scale 1 sees only those, however wide the filter could reach.
  std::vector<float> crop(3 * 4);
  resample_region(image, {4, 4, 2, 2}, unnormalised(2), crop.data());
  EXPECT_FLOAT_EQ(at(crop, 2, 0, 0, 0) * 255, 40.0f);
  EXPECT_FLOAT_EQ(at(crop, 2, 1, 1, 1) * 255, 50.0f);
  // Shrinking a crop by 2 at the image's left edge reads no column right of it.
  std::vector<float> shrunk(3 * 1);
  resample_region(image, {0, 0, 2, 2}, unnormalised(1), shrunk.data());
  EXPECT_NEAR(at(shrunk, 1, 0, 0, 0) * 255, 5.0f, 1e-3);
}

}  // namespace
}  // namespace tandem::data::image_resample_test
