#pragma once
// Reading and writing image files: JPEG through libjpeg-turbo (jpeg_decoder.h), PNG through stb_image, writing
// PNG through stb_image_write (Debian's libstb). Decoded images are always 8-bit RGB: grayscale,
// grayscale+alpha, palette, RGBA and CMYK files are converted (alpha dropped), as torchvision's ImageFolder does
// with PIL's convert("RGB"), so any folder of ordinary pictures works.
//
// Reading is two steps, so that a caller can choose the decoded size from the declared one: read_encoded_image
// reads the file and its header, decode_image decodes it, a JPEG optionally at a reduced size.
#include <cstdint>
#include <string>
#include <vector>

namespace tandem::data {

struct Image {
  int width = 0;
  int height = 0;
  std::vector<uint8_t> pixels;  // row-major height x width x 3 (RGB)
};

// The most pixels an image may declare: 32 megapixels, more than the photos in any common training set. The
// header's size is checked before decoding, because the decoders allocate the whole image before they find
// that the data runs out: a crafted JPEG of under 1 KB can declare 65531 x 1020 pixels and cost 200 MB.
inline constexpr int64_t kMaxImagePixels = int64_t{1} << 25;

enum class ImageFormat { kJpeg, kPng };

// A file's bytes, not yet decoded, and the size its header declares.
struct EncodedImage {
  std::string path;
  ImageFormat format = ImageFormat::kJpeg;
  std::vector<uint8_t> bytes;
  int width = 0;
  int height = 0;
};

// Reads `path` and its header. Throws InvalidArgument naming `path` and the reason if the file cannot be read,
// is neither a JPEG nor a PNG, has an unreadable header or declares more than kMaxImagePixels pixels.
EncodedImage read_encoded_image(const std::string& path);

// Decodes `encoded`. A JPEG is decoded at 1/reduction of its declared size in each direction, rounded up, in the
// DCT domain (reduction 1, 2, 4 or 8); a PNG always at full size: the result's width and height say which. Throws
// InvalidArgument naming the file and the decoder's reason if the data cannot be decoded.
Image decode_image(const EncodedImage& encoded, int reduction = 1);

// read_encoded_image then decode_image at full size.
Image read_image(const std::string& path);

// Writes `pixels` (row-major height x width x channels, channels 1 = gray, 3 = RGB, 4 = RGBA) as a PNG file.
// Throws Error naming `path` if it cannot be written.
void write_png(const std::string& path, const uint8_t* pixels, int width, int height, int channels);

}  // namespace tandem::data
