#pragma once
// Decoding and writing image files (stb_image / stb_image_write from Debian's libstb). Decoded images are always
// 8-bit RGB: grayscale, grayscale+alpha, palette and RGBA files are converted (alpha dropped), as torchvision's
// ImageFolder does with PIL's convert("RGB"), so any folder of ordinary pictures works.
#include <cstdint>
#include <string>
#include <vector>

namespace tandem::data {

struct Image {
  int width = 0;
  int height = 0;
  std::vector<uint8_t> pixels;  // row-major height x width x 3 (RGB)
};

// The most pixels read_image decodes: 32 megapixels, more than the photos in any common training set. The
// header's size is checked before decoding, because stb decodes a truncated file as if the missing data were
// there: a crafted JPEG of under 1 KB can declare 65531 x 1020 pixels and cost 200 MB and seconds to decode.
inline constexpr int64_t kMaxImagePixels = int64_t{1} << 25;

// Throws InvalidArgument naming `path` and the decoder's reason if the file cannot be read or decoded, also when
// the image has more than kMaxImagePixels pixels.
Image read_image(const std::string& path);

// Writes `pixels` (row-major height x width x channels, channels 1 = gray, 3 = RGB, 4 = RGBA) as a PNG file.
// Throws Error naming `path` if it cannot be written.
void write_png(const std::string& path, const uint8_t* pixels, int width, int height, int channels);

}  // namespace tandem::data
