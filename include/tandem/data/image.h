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

// Throws InvalidArgument naming `path` and the decoder's reason if the file cannot be read or decoded.
Image read_image(const std::string& path);

// Writes `pixels` (row-major height x width x channels, channels 1 = gray, 3 = RGB, 4 = RGBA) as a PNG file.
// Throws Error naming `path` if it cannot be written.
void write_png(const std::string& path, const uint8_t* pixels, int width, int height, int channels);

}  // namespace tandem::data
