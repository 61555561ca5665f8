#include "tandem/data/image.h"

#include <stb/stb_image.h>
#include <stb/stb_image_write.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <fstream>
#include <memory>

#include "tandem/data/jpeg_decoder.h"
#include "tandem/util/error.h"

namespace tandem::data {
namespace {

[[noreturn]] void fail_decode(const std::string& path, const std::string& reason) {
  throw InvalidArgument("cannot decode image " + path + " (" + reason +
                        "); fix or remove the file, or skip unreadable images (`skip_bad_images`)");
}

// Two PNG chunk layouts that stb_image 2.27 mishandles, both found by fuzz/image_decoder_fuzzer. It grows its
// IDAT buffer to a chunk's declared length before reading the chunk, so a 78-byte file declaring a 2 GB IDAT
// costs a 2 GB allocation; such a chunk runs past the end of the file, which stb would refuse only after
// allocating. And it allocates that buffer at the first non-empty IDAT, so an empty one before it is copied to
// a null pointer: undefined behaviour even for 0 bytes, which lets the compiler drop stb's later null check of
// the buffer; no encoder writes one. Walks the chunks by their lengths up to IEND, as stb does.
std::string png_chunk_problem(const std::vector<uint8_t>& bytes) {
  bool idat_seen = false;
  for (size_t pos = 8; pos + 8 <= bytes.size();) {
    const uint32_t length = (uint32_t{bytes[pos]} << 24) | (uint32_t{bytes[pos + 1]} << 16) |
                            (uint32_t{bytes[pos + 2]} << 8) | uint32_t{bytes[pos + 3]};
    const uint8_t* type = &bytes[pos + 4];
    if (std::memcmp(type, "IEND", 4) == 0) break;
    const size_t chunk_end = pos + 12 + size_t{length};  // length, type, data, CRC
    if (chunk_end > bytes.size()) {
      return detail::concat("truncated PNG: a chunk of ", length, " bytes runs past the end of the file");
    }
    if (std::memcmp(type, "IDAT", 4) == 0) {
      if (length == 0 && !idat_seen) return "corrupt PNG: an empty IDAT chunk before any image data";
      idat_seen = true;
    }
    pos = chunk_end;
  }
  return "";
}

bool file_starts_with(const std::vector<uint8_t>& bytes, const uint8_t* prefix, size_t length) {
  return bytes.size() >= length && std::memcmp(bytes.data(), prefix, length) == 0;
}

}  // namespace

EncodedImage read_encoded_image(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) fail_decode(path, std::string("cannot open file: ") + std::strerror(errno));
  EncodedImage encoded;
  encoded.path = path;
  // One read of the whole file (a byte-by-byte stream iterator cost as much as a tenth of the JPEG decode).
  file.seekg(0, std::ios::end);
  const std::streamoff file_size = file.tellg();
  file.seekg(0, std::ios::beg);
  if (file_size < 0) fail_decode(path, "cannot tell its size");
  if (file_size > INT_MAX) {
    fail_decode(path, detail::concat("the file is ", file_size, " bytes, over the ", INT_MAX,
                                     " bytes (2 GiB) an image file may have; save it smaller or with more "
                                     "compression"));
  }
  encoded.bytes.resize(static_cast<size_t>(file_size));
  file.read(reinterpret_cast<char*>(encoded.bytes.data()), file_size);
  if (file.gcount() != file_size) fail_decode(path, "read error");
  const std::vector<uint8_t>& bytes = encoded.bytes;
  // Told apart by content, not by name: JPEG's start-of-image marker, PNG's 8-byte signature.
  static constexpr uint8_t kJpegStart[2] = {0xff, 0xd8};
  static constexpr uint8_t kPngSignature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  if (file_starts_with(bytes, kJpegStart, sizeof kJpegStart)) {
    encoded.format = ImageFormat::kJpeg;
    try {
      const JpegHeader header = read_jpeg_header(bytes.data(), bytes.size());
      encoded.width = header.width, encoded.height = header.height;
    } catch (const InvalidArgument& error) {
      fail_decode(path, error.what());
    }
  } else if (file_starts_with(bytes, kPngSignature, sizeof kPngSignature)) {
    encoded.format = ImageFormat::kPng;
    const std::string problem = png_chunk_problem(bytes);
    if (!problem.empty()) fail_decode(path, problem);
    int channels_in_file = 0;
    if (!stbi_info_from_memory(bytes.data(), static_cast<int>(bytes.size()), &encoded.width, &encoded.height,
                               &channels_in_file)) {
      const char* reason = stbi_failure_reason();
      fail_decode(path, reason ? reason : "unreadable PNG header");
    }
  } else {
    fail_decode(path, "neither a JPEG nor a PNG file");
  }
  if (int64_t{encoded.width} * encoded.height > kMaxImagePixels) {
    fail_decode(path, detail::concat(encoded.width, " x ", encoded.height, " pixels, over tandem's limit of ",
                                     kMaxImagePixels, " pixels (", kMaxImagePixels >> 20,
                                     " megapixels, e.g. 8192 x 4096); scale the image down to at most that"));
  }
  return encoded;
}

Image decode_image(const EncodedImage& encoded, int reduction) {
  if (encoded.format == ImageFormat::kJpeg) {
    try {
      return decode_jpeg(encoded.bytes.data(), encoded.bytes.size(), reduction);
    } catch (const InvalidArgument& error) {
      fail_decode(encoded.path, error.what());
    }
  }
  int width = 0, height = 0, channels_in_file = 0;
  // desired_channels = 3 makes stb convert gray, gray+alpha, palette and RGBA to RGB (16-bit to 8-bit too).
  std::unique_ptr<stbi_uc, void (*)(void*)> pixels(
      stbi_load_from_memory(encoded.bytes.data(), static_cast<int>(encoded.bytes.size()), &width, &height,
                            &channels_in_file, 3),
      stbi_image_free);
  if (!pixels) {
    const char* reason = stbi_failure_reason();
    fail_decode(encoded.path, reason ? reason : "unknown error");
  }
  Image image;
  image.width = width;
  image.height = height;
  image.pixels.assign(pixels.get(), pixels.get() + static_cast<size_t>(width) * height * 3);
  return image;
}

Image read_image(const std::string& path) { return decode_image(read_encoded_image(path)); }

void write_png(const std::string& path, const uint8_t* pixels, int width, int height, int channels) {
  TANDEM_CHECK(channels >= 1 && channels <= 4 && width > 0 && height > 0, "bad PNG shape ", width, "x", height, "x",
               channels);
  if (!stbi_write_png(path.c_str(), width, height, channels, pixels, width * channels)) {
    throw Error("cannot write PNG file " + path + "; check that its folder exists and is writable");
  }
}

}  // namespace tandem::data
