// Stored zip (stored_zip.h): the local headers, the central directory and its end record of PKWARE's APPNOTE,
// without compression, encryption or zip64, which PyTorch's archives of checkpoint pieces never need.
#include "stored_zip.h"

#include <fmt/format.h>
#include <zlib.h>

#include "tandem/util/error.h"

namespace tandem::checkpoint {
namespace {

constexpr uint32_t kLocalHeader = 0x04034b50;
constexpr uint32_t kCentralHeader = 0x02014b50;
constexpr uint32_t kEndOfCentralDirectory = 0x06054b50;
constexpr size_t kLocalHeaderBytes = 30;
constexpr size_t kCentralHeaderBytes = 46;
constexpr size_t kEndBytes = 22;
constexpr size_t kAlignment = 64;  // PyTorch's, so that its readers may map a record's data in place

uint64_t zip_number(std::string_view bytes, size_t at, int width) {
  uint64_t value = 0;
  for (int i = width - 1; i >= 0; --i) value = (value << 8) | static_cast<unsigned char>(bytes[at + i]);
  return value;
}

void put_zip_number(std::string& out, uint64_t value, int width) {
  for (int i = 0; i < width; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

uint32_t crc_of(std::string_view data) {
  uLong crc = crc32(0L, Z_NULL, 0);
  // zlib takes a 32-bit length: feed it in slices.
  for (size_t at = 0; at < data.size(); at += 1u << 30) {
    const size_t part = std::min<size_t>(data.size() - at, 1u << 30);
    crc = crc32(crc, reinterpret_cast<const Bytef*>(data.data() + at), static_cast<uInt>(part));
  }
  return static_cast<uint32_t>(crc);
}

}  // namespace

std::vector<StoredZipEntry> read_stored_zip(std::string_view bytes, const std::string& source) {
  const auto damaged = [&](const std::string& what) {
    return InvalidArgument(fmt::format("{}: not a PyTorch archive: {}", source, what));
  };
  if (bytes.size() < kEndBytes) throw damaged("it is cut short");
  // The end record is the last 22 bytes unless a comment follows it (at most 65535 bytes).
  size_t end = std::string_view::npos;
  const size_t lowest = bytes.size() > kEndBytes + 0xffff ? bytes.size() - kEndBytes - 0xffff : 0;
  for (size_t at = bytes.size() - kEndBytes + 1; at-- > lowest;) {
    if (zip_number(bytes, at, 4) == kEndOfCentralDirectory) {
      end = at;
      break;
    }
  }
  if (end == std::string_view::npos) throw damaged("it has no end of central directory (cut short?)");
  const uint64_t count = zip_number(bytes, end + 10, 2);
  const uint64_t directory_size = zip_number(bytes, end + 12, 4);
  const uint64_t directory_at = zip_number(bytes, end + 16, 4);
  if (count == 0xffff || directory_at == 0xffffffff) throw damaged("it is a zip64 archive, which is not read here");
  if (directory_at > end || directory_size > end - directory_at) throw damaged("its central directory lies outside it");

  std::vector<StoredZipEntry> entries;
  size_t at = directory_at;
  // Records in order, none overlapping another: a forged directory listing one large record many times would have
  // its checksum computed as often.
  uint64_t records_end = 0;
  for (uint64_t i = 0; i < count; ++i) {
    if (end - at < kCentralHeaderBytes || zip_number(bytes, at, 4) != kCentralHeader) {
      throw damaged(fmt::format("central directory entry {} is damaged", i));
    }
    const uint64_t method = zip_number(bytes, at + 10, 2);
    const uint32_t crc = static_cast<uint32_t>(zip_number(bytes, at + 16, 4));
    const uint64_t stored_size = zip_number(bytes, at + 20, 4);
    const uint64_t size = zip_number(bytes, at + 24, 4);
    const uint64_t name_length = zip_number(bytes, at + 28, 2);
    const uint64_t extra_length = zip_number(bytes, at + 30, 2);
    const uint64_t comment_length = zip_number(bytes, at + 32, 2);
    const uint64_t local_at = zip_number(bytes, at + 42, 4);
    if (end - at - kCentralHeaderBytes < name_length + extra_length + comment_length) {
      throw damaged(fmt::format("central directory entry {} is cut short", i));
    }
    StoredZipEntry entry;
    entry.name = std::string(bytes.substr(at + kCentralHeaderBytes, name_length));
    at += kCentralHeaderBytes + name_length + extra_length + comment_length;
    if (method != 0 || stored_size != size) throw damaged(fmt::format("record '{}' is compressed", entry.name));
    if (local_at < records_end || local_at > directory_at || directory_at - local_at < kLocalHeaderBytes ||
        zip_number(bytes, local_at, 4) != kLocalHeader) {
      throw damaged(fmt::format("record '{}' has no local header where the directory says", entry.name));
    }
    const uint64_t data_at = local_at + kLocalHeaderBytes + zip_number(bytes, local_at + 26, 2) +
                             zip_number(bytes, local_at + 28, 2);
    if (data_at > directory_at || size > directory_at - data_at) {
      throw damaged(fmt::format("record '{}' lies outside the archive (cut short?)", entry.name));
    }
    entry.data = bytes.substr(data_at, size);
    records_end = data_at + size;
    if (crc_of(entry.data) != crc) {
      throw damaged(fmt::format("record '{}' does not match its CRC-32 (the file is damaged)", entry.name));
    }
    entries.push_back(std::move(entry));
  }
  return entries;
}

uint64_t write_stored_zip(const std::vector<std::pair<std::string, std::string_view>>& records,
                          const std::function<void(std::string_view)>& append) {
  uint64_t written = 0;
  const auto put = [&](std::string_view bytes) {
    append(bytes);
    written += bytes.size();
  };
  std::string directory;
  for (const auto& record : records) {
    // Named, not bound: the header lambda below captures them (clang 14 cannot capture structured bindings).
    const std::string& name = record.first;
    const std::string_view data = record.second;
    TANDEM_CHECK(data.size() < 0xffffffffu && name.size() < 0xffff, "a zip record over 4 GiB: ", name);
    const uint32_t crc = crc_of(data);
    const uint64_t local_at = written;
    // Padding in an extra field of PyTorch's id "FB" puts the data at a multiple of 64 bytes.
    const size_t unpadded = local_at + kLocalHeaderBytes + name.size() + 4;
    const size_t padding = (kAlignment - unpadded % kAlignment) % kAlignment;
    const auto header = [&](std::string& to, bool central) {
      put_zip_number(to, central ? kCentralHeader : kLocalHeader, 4);
      if (central) put_zip_number(to, 20, 2);  // made by: 2.0
      put_zip_number(to, 20, 2);               // needed: 2.0
      put_zip_number(to, 0, 2);                // flags
      put_zip_number(to, 0, 2);                // stored
      put_zip_number(to, 0, 4);                // time and date: none
      put_zip_number(to, crc, 4);
      put_zip_number(to, data.size(), 4);
      put_zip_number(to, data.size(), 4);
      put_zip_number(to, name.size(), 2);
      put_zip_number(to, central ? 0 : 4 + padding, 2);
      if (central) {
        put_zip_number(to, 0, 2);  // comment
        put_zip_number(to, 0, 2);  // disk
        put_zip_number(to, 0, 2);  // internal attributes
        put_zip_number(to, 0, 4);  // external attributes
        put_zip_number(to, local_at, 4);
      }
      to += name;
    };
    std::string local;
    header(local, false);
    put_zip_number(local, 0x4246, 2);  // "FB"
    put_zip_number(local, padding, 2);
    local.append(padding, 'Z');
    put(local);
    put(data);
    header(directory, true);
  }
  TANDEM_CHECK(written < 0xffffffffu, "a zip archive over 4 GiB");
  const uint64_t directory_at = written;
  std::string end = directory;
  put_zip_number(end, kEndOfCentralDirectory, 4);
  put_zip_number(end, 0, 2);
  put_zip_number(end, 0, 2);
  put_zip_number(end, records.size(), 2);
  put_zip_number(end, records.size(), 2);
  put_zip_number(end, directory.size(), 4);
  put_zip_number(end, directory_at, 4);
  put_zip_number(end, 0, 2);
  put(end);
  return written;
}

}  // namespace tandem::checkpoint
