#include "tandem/data/idx_file.h"

#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>

#include "tandem/util/error.h"

namespace tandem::data {
namespace {

constexpr uint8_t kIdxUnsignedByte = 0x08;

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw InvalidArgument(detail::concat(path, ": ", what));
}

std::vector<uint8_t> gunzip(const std::string& path, const std::vector<uint8_t>& compressed) {
  if (compressed.size() > std::numeric_limits<uInt>::max()) fail(path, "gzip file larger than 4 GiB is not supported");
  z_stream stream;
  std::memset(&stream, 0, sizeof(stream));
  // 15 + 16: a gzip header and trailer (with CRC check) around a deflate stream with the largest window.
  if (inflateInit2(&stream, 15 + 16) != Z_OK) fail(path, "could not initialise zlib");
  stream.next_in = const_cast<Bytef*>(compressed.data());
  stream.avail_in = static_cast<uInt>(compressed.size());

  std::vector<uint8_t> out;
  out.resize(std::max<size_t>(compressed.size() * 4, 1 << 16));
  size_t produced = 0;
  int status = Z_OK;
  while (true) {
    if (produced == out.size()) out.resize(out.size() * 2);
    stream.next_out = out.data() + produced;
    stream.avail_out = static_cast<uInt>(std::min<size_t>(out.size() - produced, std::numeric_limits<uInt>::max()));
    const uInt before = stream.avail_out;
    status = inflate(&stream, Z_NO_FLUSH);
    produced += before - stream.avail_out;
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
  out.resize(produced);
  return out;
}

uint32_t read_big_endian(const uint8_t* bytes) {
  return (uint32_t{bytes[0]} << 24) | (uint32_t{bytes[1]} << 16) | (uint32_t{bytes[2]} << 8) | uint32_t{bytes[3]};
}

}  // namespace

std::vector<uint8_t> read_maybe_gzipped_file(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) fail(path, std::string("cannot open file: ") + std::strerror(errno));
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  if (file.bad()) fail(path, "read error");
  if (bytes.size() >= 2 && bytes[0] == 0x1f && bytes[1] == 0x8b) return gunzip(path, bytes);
  return bytes;
}

IdxArray read_idx_file(const std::string& path) {
  const std::vector<uint8_t> bytes = read_maybe_gzipped_file(path);
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
