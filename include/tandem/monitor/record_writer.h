#pragma once
// A TFRecord file, the container of TensorBoard's event files: a sequence of records, each
//   uint64 length (little-endian) | uint32 masked CRC32C of those 8 bytes | data | uint32 masked CRC32C of data
// (see crc32c.h for the mask). A reader stops at a record cut short by a crash, so a killed writer loses at
// most the record it was writing.
#include <cstdio>
#include <string>
#include <string_view>

namespace tandem::monitor {

class RecordWriter {
 public:
  // Creates `path`, which must not exist yet: a writer never truncates or appends to another's records.
  // Throws Error naming the file if it cannot be created.
  explicit RecordWriter(const std::string& path);
  ~RecordWriter();
  RecordWriter(const RecordWriter&) = delete;
  RecordWriter& operator=(const RecordWriter&) = delete;

  // Both throw Error naming the file when the write fails. A record reaches the file at the latest on
  // flush().
  void write(std::string_view data);
  void flush();

  const std::string& path() const { return path_; }

 private:
  [[noreturn]] void throw_write_error() const;

  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace tandem::monitor
