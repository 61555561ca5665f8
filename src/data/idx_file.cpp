#include "tandem/data/idx_file.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>

#include "tandem/util/error.h"

namespace tandem::data {
namespace {

constexpr uint8_t kIdxUnsignedByte = 0x08;

// No IDX file tandem reads comes near this (EMNIST's largest holds about 550 MB); a header that declares more,
// or a file without a readable header, is refused here rather than when memory runs out.
constexpr uint64_t kMaxIdxFileBytes = uint64_t{1} << 30;

constexpr size_t kInflateChunkBytes = size_t{1} << 16;

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw InvalidArgument(detail::concat(path, ": ", what));
}

// The most bytes a file may decompress to, given the bytes decompressed so far (it is asked again as they grow).
using SizeLimit = std::function<uint64_t(const std::vector<uint8_t>& so_far)>;

// Inflates in chunks and refuses the file as soon as its output passes the limit, so a gzip bomb costs at most
// the limit plus one chunk of memory and is never inflated to its end.
std::vector<uint8_t> gunzip(const std::string& path, const std::vector<uint8_t>& compressed,
                            const SizeLimit& size_limit) {
  if (compressed.size() > std::numeric_limits<uInt>::max()) fail(path, "gzip file larger than 4 GiB is not supported");
  z_stream stream;
  std::memset(&stream, 0, sizeof(stream));
  // 15 + 16: a gzip header and trailer (with CRC check) around a deflate stream with the largest window.
  if (inflateInit2(&stream, 15 + 16) != Z_OK) fail(path, "could not initialise zlib");
  stream.next_in = const_cast<Bytef*>(compressed.data());
  stream.avail_in = static_cast<uInt>(compressed.size());

  std::vector<uint8_t> out;
  std::vector<uint8_t> chunk(kInflateChunkBytes);
  while (true) {
    stream.next_out = chunk.data();
    stream.avail_out = static_cast<uInt>(chunk.size());
    const int status = inflate(&stream, Z_NO_FLUSH);
    out.insert(out.end(), chunk.begin(), chunk.end() - stream.avail_out);
    const uint64_t limit = size_limit(out);
    if (out.size() > limit) {
      inflateEnd(&stream);
      fail(path, detail::concat("decompresses to more than ", limit,
                                " bytes; the file is not an IDX file or is corrupt"));
    }
    if (status == Z_STREAM_END) {
      // gzip allows several members back to back; continue with the next one if bytes remain.
      if (stream.avail_in == 0) break;
      if (inflateReset(&stream) != Z_OK) break;
      continue;
    }
    if (status == Z_BUF_ERROR && stream.avail_in == 0) {
      inflateEnd(&stream);
      fail(path, "gzip data is truncated (the file ends before the compressed stream does); download it again");
    }
    if (status != Z_OK && status != Z_BUF_ERROR) {
      const std::string message = stream.msg ? stream.msg : "unknown zlib error";
      inflateEnd(&stream);
      fail(path, "corrupt gzip data (" + message + "); download it again");
    }
  }
  inflateEnd(&stream);
  return out;
}

uint32_t read_big_endian(const uint8_t* bytes) {
  return (uint32_t{bytes[0]} << 24) | (uint32_t{bytes[1]} << 16) | (uint32_t{bytes[2]} << 8) | uint32_t{bytes[3]};
}

// The size an IDX file must have once its header is in: 4 + 4 * dims bytes of header, then one byte per element
// (the only element type tandem reads). Until then, or for a header read_idx_file will refuse anyway, the
// absolute cap.
uint64_t idx_size_limit(const std::vector<uint8_t>& so_far) {
  if (so_far.size() < 4 || so_far[0] != 0 || so_far[1] != 0 || so_far[2] != kIdxUnsignedByte) return kMaxIdxFileBytes;
  const size_t header = 4 + 4 * size_t{so_far[3]};
  if (so_far.size() < header) return kMaxIdxFileBytes;
  uint64_t elements = 1;
  for (size_t d = 0; d < so_far[3]; ++d) {
    // Saturates just past the cap (no overflow: under 2^31 times under 2^32); a later 0 still gives 0.
    elements = std::min(elements * read_big_endian(so_far.data() + 4 + 4 * d), kMaxIdxFileBytes + 1);
  }
  return std::min(header + elements, kMaxIdxFileBytes);
}

std::vector<uint8_t> read_file(const std::string& path, const SizeLimit& size_limit) {
  std::ifstream file(path, std::ios::binary);
  if (!file) fail(path, std::string("cannot open file: ") + std::strerror(errno));
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  if (file.bad()) fail(path, "read error");
  if (bytes.size() >= 2 && bytes[0] == 0x1f && bytes[1] == 0x8b) return gunzip(path, bytes, size_limit);
  return bytes;
}

}  // namespace

std::vector<uint8_t> read_maybe_gzipped_file(const std::string& path) {
  return read_file(path, [](const std::vector<uint8_t>&) { return kMaxIdxFileBytes; });
}

IdxArray read_idx_file(const std::string& path) {
  const std::vector<uint8_t> bytes = read_file(path, idx_size_limit);
  if (bytes.size() < 4) fail(path, detail::concat("truncated: ", bytes.size(), " bytes, too short for an IDX header"));
  if (bytes[0] != 0 || bytes[1] != 0) {
    fail(path, detail::concat("bad magic: not an IDX file (first bytes 0x", std::hex, int{bytes[0]}, " 0x",
                              int{bytes[1]}, ", expected 0x0 0x0)"));
  }
  if (bytes[2] != kIdxUnsignedByte) {
    fail(path, detail::concat("bad magic: element type 0x", std::hex, int{bytes[2]},
                              " is not supported (MNIST files hold unsigned bytes, type 0x8)"));
  }
  const size_t ndims = bytes[3];
  if (ndims == 0) fail(path, "bad magic: an IDX file with 0 dimensions");
  const size_t header = 4 + 4 * ndims;
  if (bytes.size() < header) {
    fail(path, detail::concat("truncated: the header declares ", ndims, " dimensions but the file has only ",
                              bytes.size(), " bytes"));
  }
  IdxArray array;
  uint64_t count = 1;
  for (size_t d = 0; d < ndims; ++d) {
    const uint32_t extent = read_big_endian(bytes.data() + 4 + 4 * d);
    array.dims.push_back(extent);
    count *= extent;
    if (count > bytes.size()) break;  // will fail below; avoids overflow on absurd headers
  }
  const uint64_t available = bytes.size() - header;
  if (available < count) {
    fail(path, detail::concat("truncated: the header promises ", count, " bytes of data but only ", available,
                              " follow; download the file again"));
  }
  if (available > count) {
    fail(path, detail::concat("corrupt: ", available - count, " bytes follow the ", count,
                              " bytes of data the header declares"));
  }
  array.values.assign(bytes.begin() + static_cast<std::ptrdiff_t>(header), bytes.end());
  return array;
}

}  // namespace tandem::data
