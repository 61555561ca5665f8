#pragma once
// The IDX file format of MNIST and Fashion-MNIST (http://yann.lecun.com/exdb/mnist/): a 4-byte magic
// (0, 0, element type, number of dimensions), one big-endian uint32 per dimension, then the elements.
// Files may be plain or gzip-compressed; the reader tells them apart by the gzip magic bytes, not the name.
#include <cstdint>
#include <string>
#include <vector>

namespace tandem::data {

// The unsigned-byte arrays MNIST uses (element type 0x08), which is all tandem reads.
struct IdxArray {
  std::vector<int64_t> dims;
  std::vector<uint8_t> values;  // row-major, product(dims) bytes
};

// Reads a whole IDX file. Every failure throws InvalidArgument naming `path` and what is wrong: missing or
// unreadable file, corrupt or truncated gzip data, gzip data that inflates past what the IDX header declares
// (refused while inflating, so a gzip bomb never fills memory), bad magic, an element type other than unsigned
// byte, fewer bytes than the header promises (truncated) or bytes left over after the data.
IdxArray read_idx_file(const std::string& path);

// The file's bytes, gunzipped when it starts with the gzip magic. Throws InvalidArgument naming `path`, also
// when the gzip data inflates past 1 GiB, more than any IDX file tandem reads.
std::vector<uint8_t> read_maybe_gzipped_file(const std::string& path);

}  // namespace tandem::data
