#include "tandem/data/image.h"

#include <stb/stb_image.h>
#include <stb/stb_image_write.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>

#include "tandem/util/error.h"

namespace tandem::data {
namespace {

constexpr int kMaxHuffmanCodes = 256;

[[noreturn]] void fail_decode(const std::string& path, const std::string& reason) {
  throw InvalidArgument("cannot decode image " + path + " (" + reason +
                        "); fix or remove the file, or skip unreadable images (`skip_bad_images`)");
}

// stb_image 2.27 (Debian's libstb) trusts the code counts of a JPEG Huffman table and stores one entry per code
// in arrays of 256, so a file whose table declares more codes overruns the decoder's heap memory
// (fuzz/image_decoder_fuzzer found it; newer stb refuses such tables). Until every build has a fixed stb, the
// tables are checked here first. The walk finds every table stb's decoder can reach: it resyncs on any 0xff
// as stb does before the frame header, treats stuffed bytes and restart markers in scan data as data, and takes
// each segment's length as stb does; where stb would stop with an error instead, the walk goes on, so it may
// look at more tables than stb, never fewer. Returns what is wrong, or "" when every table is in bounds.
std::string jpeg_huffman_table_problem(const std::vector<uint8_t>& bytes) {
  // stb's reader yields 0 past the end of the file, and so does this.
  const auto byte_at = [&](size_t i) -> int { return i < bytes.size() ? bytes[i] : 0; };
  size_t pos = 0;
  while (pos < bytes.size()) {
    if (bytes[pos++] != 0xff) continue;
    while (pos < bytes.size() && bytes[pos] == 0xff) ++pos;  // fill bytes before a marker
    const int marker = byte_at(pos++);
    const bool no_segment = marker == 0x00 || (marker >= 0xd0 && marker <= 0xd8) || marker == 0x01;
    if (no_segment) continue;
    if (marker == 0xd9) break;  // end of image: stb reads no further
    const int length = (byte_at(pos) << 8) | byte_at(pos + 1);
    if (marker == 0xc4) {
      // A DHT segment holds tables back to back: class and id, 16 code counts, then one value per code.
      size_t table = pos + 2;
      for (int left = length - 2; left > 0;) {
        const int class_and_id = byte_at(table);
        if ((class_and_id >> 4) > 1 || (class_and_id & 15) > 3) break;  // stb refuses the segment here
        int codes = 0;
        for (int i = 1; i <= 16; ++i) codes += byte_at(table + i);
        if (codes > kMaxHuffmanCodes) {
          return detail::concat("corrupt JPEG: a Huffman table declares ", codes, " codes, more than ",
                                kMaxHuffmanCodes);
        }
        table += 17 + static_cast<size_t>(codes);
        left -= 17 + codes;
      }
    }
    pos += static_cast<size_t>(length);
  }
  return "";
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

}  // namespace

Image read_image(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) fail_decode(path, std::string("cannot open file: ") + std::strerror(errno));
  const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  if (file.bad()) fail_decode(path, "read error");
  if (bytes.size() > INT_MAX) fail_decode(path, "larger than 2 GiB");
  // JPEG files start with 0xff, and stb takes any file that does as a JPEG candidate; PNG files start with
  // the 8-byte signature.
  static constexpr uint8_t kPngSignature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  std::string problem;
  if (!bytes.empty() && bytes[0] == 0xff) {
    problem = jpeg_huffman_table_problem(bytes);
  } else if (bytes.size() >= 8 && std::memcmp(bytes.data(), kPngSignature, 8) == 0) {
    problem = png_chunk_problem(bytes);
  }
  if (!problem.empty()) fail_decode(path, problem);
  int width = 0, height = 0, channels_in_file = 0;
  const auto* data = bytes.data();
  const int size = static_cast<int>(bytes.size());
  if (stbi_info_from_memory(data, size, &width, &height, &channels_in_file) &&
      int64_t{width} * height > kMaxImagePixels) {
    fail_decode(path, detail::concat(width, " x ", height, " pixels, over tandem's limit of ", kMaxImagePixels,
                                     "; scale the image down"));
  }
  // desired_channels = 3 makes stb convert gray, gray+alpha, palette and RGBA to RGB (16-bit to 8-bit too).
  std::unique_ptr<stbi_uc, void (*)(void*)> pixels(
      stbi_load_from_memory(data, size, &width, &height, &channels_in_file, 3),
      stbi_image_free);
  if (!pixels) {
    const char* reason = stbi_failure_reason();
    fail_decode(path, reason ? reason : "unknown error");
  }
  Image image;
  image.width = width;
  image.height = height;
  image.pixels.assign(pixels.get(), pixels.get() + static_cast<size_t>(width) * height * 3);
  return image;
}

void write_png(const std::string& path, const uint8_t* pixels, int width, int height, int channels) {
  TANDEM_CHECK(channels >= 1 && channels <= 4 && width > 0 && height > 0, "bad PNG shape ", width, "x", height, "x",
               channels);
  if (!stbi_write_png(path.c_str(), width, height, channels, pixels, width * channels)) {
    throw Error("cannot write PNG file " + path + "; check that its folder exists and is writable");
  }
}

}  // namespace tandem::data
