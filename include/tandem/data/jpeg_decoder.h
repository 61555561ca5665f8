#pragma once
// JPEG decoding with libjpeg-turbo's TurboJPEG API (Debian's libturbojpeg0-dev): SIMD Huffman decoding, IDCT
// and colour conversion, and decoding at 1/2, 1/4 or 1/8 of the size in the DCT domain, which skips most of the
// IDCT's work and all of the pixels that a later downscale would have averaged away. image.h chooses this
// decoder for every file that starts like a JPEG; image_transform.h says when a crop allows a reduced size.
#include <cstddef>
#include <cstdint>

#include "tandem/data/image.h"

namespace tandem::data {

// What a JPEG's header declares, read without decoding any pixels.
struct JpegHeader {
  int width = 0;
  int height = 0;
};

// Throws InvalidArgument with libjpeg-turbo's reason (no path: the caller names the file) if the bytes do not
// start with a readable JPEG header.
JpegHeader read_jpeg_header(const uint8_t* bytes, size_t size);

// Decodes to 8-bit RGB at 1/reduction of the declared size in each direction, rounded up (reduction 1, 2, 4
// or 8). Grayscale is expanded to RGB and CMYK/YCCK (Adobe's inverted CMYK, as Photoshop writes it) converted
// as PIL converts it, so that every JPEG torchvision's ImageFolder reads is read alike. A file that ends early
// or holds corrupt data is refused: libjpeg-turbo would fill the missing part with gray and call that a warning.
// Throws InvalidArgument with the reason. Safe to call from several threads at once.
Image decode_jpeg(const uint8_t* bytes, size_t size, int reduction);

}  // namespace tandem::data
