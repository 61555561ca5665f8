#include "tandem/data/jpeg_decoder.h"

#include <turbojpeg.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "tandem/util/error.h"

namespace tandem::data {
namespace jpeg_decoder_detail {
namespace {

// A TurboJPEG handle holds libjpeg's decompressor and its error state, so it must not be shared between
// threads; making one per image would cost its allocations every time. Each decoding thread keeps its own
// for as long as it lives (the image folder's worker threads live as long as the data set).
tjhandle thread_decompressor() {
  thread_local const std::unique_ptr<void, int (*)(tjhandle)> handle(tjInitDecompress(), tjDestroy);
  if (!handle) throw Error(std::string("libjpeg-turbo cannot start a decompressor: ") + tjGetErrorStr2(nullptr));
  return handle.get();
}

[[noreturn]] void refuse(tjhandle decompressor) {
  throw InvalidArgument(std::string("corrupt JPEG: ") + tjGetErrorStr2(decompressor));
}

// libjpeg's JWRN_EXTRANEOUS_DATA, the one warning that says the file holds bytes too many rather than too few;
// TurboJPEG reports only the message of the last warning.
bool warned_only_of_stray_bytes(tjhandle decompressor) {
  return tjGetErrorCode(decompressor) == TJERR_WARNING &&
         std::strstr(tjGetErrorStr2(decompressor), "extraneous bytes before marker") != nullptr;
}

struct Header {
  int width = 0, height = 0, colorspace = 0;
};

Header read_header(tjhandle decompressor, const uint8_t* bytes, size_t size) {
  Header header;
  int subsampling = 0;
  // Stray bytes before the start of scan are met while the header is read: a warning, after which the header
  // is complete.
  if (tjDecompressHeader3(decompressor, bytes, static_cast<unsigned long>(size), &header.width, &header.height,
                          &subsampling, &header.colorspace) != 0 &&
      !(warned_only_of_stray_bytes(decompressor) && header.width > 0 && header.height > 0)) {
    refuse(decompressor);
  }
  return header;
}

// `reduction` if libjpeg-turbo offers 1/reduction among its DCT scaling factors (every release since 1.2 offers
// all n/8), else 1.
int supported_reduction(int reduction) {
  int count = 0;
  const tjscalingfactor* factors = tjGetScalingFactors(&count);
  for (int i = 0; factors && i < count; ++i) {
    if (factors[i].num * reduction == factors[i].denom) return reduction;
  }
  return 1;
}

// Adobe's CMYK JPEGs store inverted ink, so a stored value is 255 minus the ink; PIL's CMYK;I reading followed
// by convert("RGB") gives red = c * k / 255 on the stored values, and so on for green and blue.
std::vector<uint8_t> cmyk_to_rgb(const std::vector<uint8_t>& cmyk) {
  std::vector<uint8_t> rgb(cmyk.size() / 4 * 3);
  for (size_t i = 0, o = 0; i < cmyk.size(); i += 4, o += 3) {
    const int k = cmyk[i + 3];
    for (int c = 0; c < 3; ++c) rgb[o + c] = static_cast<uint8_t>((cmyk[i + c] * k + 127) / 255);
  }
  return rgb;
}

}  // namespace
}  // namespace jpeg_decoder_detail

JpegHeader read_jpeg_header(const uint8_t* bytes, size_t size) {
  const auto header = jpeg_decoder_detail::read_header(jpeg_decoder_detail::thread_decompressor(), bytes, size);
  return {header.width, header.height};
}

Image decode_jpeg(const uint8_t* bytes, size_t size, int reduction) {
  using namespace jpeg_decoder_detail;
  TANDEM_CHECK(reduction == 1 || reduction == 2 || reduction == 4 || reduction == 8, "JPEG reduction ", reduction,
               " is not 1, 2, 4 or 8");
  const tjhandle decompressor = thread_decompressor();
  const Header header = read_header(decompressor, bytes, size);
  const tjscalingfactor scale{1, supported_reduction(reduction)};
  Image image;
  image.width = TJSCALED(header.width, scale);
  image.height = TJSCALED(header.height, scale);
  // libjpeg converts only colour to colour and gray to either; four-channel files come out as stored.
  const bool cmyk = header.colorspace == TJCS_CMYK || header.colorspace == TJCS_YCCK;
  std::vector<uint8_t> pixels(static_cast<size_t>(image.width) * image.height * (cmyk ? 4 : 3));
  const auto decompress = [&](int flags) {
    return tjDecompress2(decompressor, bytes, static_cast<unsigned long>(size), pixels.data(), image.width, 0,
                         image.height, cmyk ? TJPF_CMYK : TJPF_RGB, flags);
  };
  // A truncated file or corrupt data is a warning to libjpeg, which would go on and fill the rest with gray; a
  // training set should not learn from that, so the first warning stops the decode and the image is refused like
  // any unreadable one. Stray bytes before a marker lose no pixel, and PIL (so torchvision) loads such files,
  // common in photo collections: those are decoded again to the end and kept if nothing worse was met.
  if (decompress(TJFLAG_STOPONWARNING) != 0) {
    if (!warned_only_of_stray_bytes(decompressor)) refuse(decompressor);
    if (decompress(0) != 0 && !warned_only_of_stray_bytes(decompressor)) refuse(decompressor);
  }
  image.pixels = cmyk ? cmyk_to_rgb(pixels) : std::move(pixels);
  return image;
}

}  // namespace tandem::data
