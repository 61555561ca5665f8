#pragma once
// Builds one protocol buffer message in the wire format, field by field, so that tandem writes TensorBoard's
// Event messages without depending on a protobuf library. A nested message is encoded on its own first and
// added as a length-delimited field of its parent. Fields are written in the order they are added; protobuf
// readers accept any order.
#include <cstdint>
#include <string>
#include <string_view>

namespace tandem::monitor {

class ProtobufEncoder {
 public:
  // int64, int32 and enum fields. A negative value takes 10 bytes, as protobuf's own encoders write it.
  void add_int64(int field, int64_t value);
  void add_double(int field, double value);
  void add_float(int field, float value);
  // string, bytes and embedded-message fields.
  void add_bytes(int field, std::string_view bytes);

  const std::string& bytes() const { return bytes_; }

 private:
  enum class WireType { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

  void append_key(int field, WireType type);
  void append_varint(uint64_t value);
  void append_little_endian(uint64_t value, int size);

  std::string bytes_;
};

}  // namespace tandem::monitor
