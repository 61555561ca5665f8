#include "tandem/monitor/record_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

#include "tandem/monitor/crc32c.h"
#include "tandem/util/atomic_file.h"
#include "tandem/util/error.h"

namespace tandem::monitor {
namespace {

void append_little_endian(std::string& out, uint64_t value, int size) {
  for (int i = 0; i < size; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xFF));
}

}  // namespace

RecordWriter::RecordWriter(const std::string& path) : path_(path) {
  // O_EXCL: fail rather than overwrite a file that exists, or write through a link planted in its place.
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0 && errno == EEXIST) refuse_symbolic_link(path);
  if (fd >= 0) file_ = ::fdopen(fd, "wb");
  if (!file_) {
    const int open_errno = errno;
    if (fd >= 0) ::close(fd);
    throw Error("cannot create TensorBoard event file " + path + ": " + std::strerror(open_errno));
  }
}

RecordWriter::~RecordWriter() {
  if (file_) std::fclose(file_);
}

void RecordWriter::write(std::string_view data) {
  std::string record;
  record.reserve(data.size() + 16);
  append_little_endian(record, data.size(), 8);
  append_little_endian(record, masked_crc32c(record), 4);
  record.append(data);
  append_little_endian(record, masked_crc32c(data), 4);
  if (std::fwrite(record.data(), 1, record.size(), file_) != record.size()) throw_write_error();
}

void RecordWriter::flush() {
  if (std::fflush(file_) != 0) throw_write_error();
}

void RecordWriter::throw_write_error() const {
  throw Error("cannot write TensorBoard event file " + path_ + ": " + std::strerror(errno));
}

}  // namespace tandem::monitor
