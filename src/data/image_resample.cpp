#include "tandem/data/image_resample.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "tandem/util/error.h"

namespace tandem::data {
namespace image_resample_detail {
namespace {

// For each output pixel along one axis: the first input pixel it reads, how many, and their weights.
struct Taps {
  std::vector<int> first, count;
  int stride = 0;              // weights per output pixel, the widest count
  std::vector<float> weights;  // stride per output pixel, summing to 1
};

// PIL's bilinear coefficients for output pixels 0..out_size-1 covering [start, start + length) of an axis, reading
// only input pixels in [low, high): a triangle of radius 1 output pixel, widened to the downscale factor when
// shrinking, centred on each output pixel's centre in input coordinates.
Taps compute_taps(double start, double length, int out_size, int low, int high) {
  const double scale = length / out_size;
  const double radius = std::max(scale, 1.0);
  Taps taps;
  taps.stride = 2 * static_cast<int>(std::ceil(radius)) + 1;
  taps.first.resize(out_size);
  taps.count.resize(out_size);
  taps.weights.assign(static_cast<size_t>(out_size) * taps.stride, 0.0f);
  for (int o = 0; o < out_size; ++o) {
    const double center = start + (o + 0.5) * scale;
    const int first = std::max(static_cast<int>(std::floor(center - radius + 0.5)), low);
    const int end = std::min({static_cast<int>(std::floor(center + radius + 0.5)), high, first + taps.stride});
    float* w = &taps.weights[static_cast<size_t>(o) * taps.stride];
    double total = 0;
    for (int i = first; i < end; ++i) {
      const double weight = std::max(0.0, 1.0 - std::abs((i + 0.5 - center) / radius));
      w[i - first] = static_cast<float>(weight);
      total += weight;
    }
    // Every output pixel's centre lies inside the region, so at least its nearest input pixel has weight.
    TANDEM_CHECK(total > 0, "no input pixel under output pixel ", o, " of ", out_size);
    for (int i = 0; i < end - first; ++i) w[i] = static_cast<float>(w[i] / total);
    taps.first[o] = first;
    taps.count[o] = end - first;
  }
  return taps;
}

// Rows [row_begin, row_end) of `image`, each filtered horizontally to `columns`: RGB floats, size * 3 per row.
void resample_rows(const Image& image, const Taps& columns, int row_begin, int row_end, int size, float* rows) {
  for (int r = row_begin; r < row_end; ++r) {
    const uint8_t* src = image.pixels.data() + static_cast<size_t>(r) * image.width * 3;
    float* dst = rows + static_cast<size_t>(r - row_begin) * size * 3;
    for (int o = 0; o < size; ++o) {
      const float* w = &columns.weights[static_cast<size_t>(o) * columns.stride];
      const uint8_t* p = src + static_cast<size_t>(columns.first[o]) * 3;
      float red = 0, green = 0, blue = 0;
      for (int t = 0; t < columns.count[o]; ++t) {
        red += w[t] * p[3 * t];
        green += w[t] * p[3 * t + 1];
        blue += w[t] * p[3 * t + 2];
      }
      dst[3 * o] = red, dst[3 * o + 1] = green, dst[3 * o + 2] = blue;
    }
  }
}

}  // namespace
}  // namespace image_resample_detail

void resample_region(const Image& image, const ImageRegion& region, const ResampleTarget& target, float* out) {
  using namespace image_resample_detail;
  TANDEM_CHECK(region.width > 0 && region.height > 0 && region.x0 >= 0 && region.y0 >= 0 &&
                   region.x0 + region.width <= image.width + 1e-6 && region.y0 + region.height <= image.height + 1e-6,
               "region ", region.x0, ",", region.y0, " ", region.width, "x", region.height, " outside a ", image.width,
               "x", image.height, " image");
  const int size = target.size;
  const auto pixel_span = [](double start, double length, int limit) {
    return std::pair<int, int>{std::max(0, static_cast<int>(std::floor(start))),
                               std::min(limit, static_cast<int>(std::ceil(start + length)))};
  };
  const auto [x_low, x_high] = pixel_span(region.x0, region.width, image.width);
  const auto [y_low, y_high] = pixel_span(region.y0, region.height, image.height);
  const Taps columns = compute_taps(region.x0, region.width, size, x_low, x_high);
  const Taps rows = compute_taps(region.y0, region.height, size, y_low, y_high);

  // The horizontal pass covers only the rows the vertical one reads. Kept per thread: a fresh buffer of this
  // size would be a new mapping whose pages the kernel zeroes on every image.
  const int row_begin = rows.first.front();
  const int row_end = rows.first.back() + rows.count.back();
  thread_local std::vector<float> filtered_rows, line;
  filtered_rows.resize(static_cast<size_t>(row_end - row_begin) * size * 3);
  resample_rows(image, columns, row_begin, row_end, size, filtered_rows.data());

  const int64_t plane = static_cast<int64_t>(size) * size;
  line.resize(static_cast<size_t>(size) * 3);
  for (int y = 0; y < size; ++y) {
    std::fill(line.begin(), line.end(), 0.0f);
    const float* w = &rows.weights[static_cast<size_t>(y) * rows.stride];
    for (int t = 0; t < rows.count[y]; ++t) {
      const float* src = filtered_rows.data() + static_cast<size_t>(rows.first[y] - row_begin + t) * size * 3;
      for (int i = 0; i < size * 3; ++i) line[i] += w[t] * src[i];
    }
    for (int c = 0; c < 3; ++c) {
      const float scale = 1.0f / (255.0f * target.std[c]), shift = -target.mean[c] / target.std[c];
      float* dst = out + c * plane + static_cast<int64_t>(y) * size;
      for (int x = 0; x < size; ++x) {
        const int src_x = target.flip ? size - 1 - x : x;
        dst[x] = line[3 * src_x + c] * scale + shift;
      }
    }
  }
}

}  // namespace tandem::data
