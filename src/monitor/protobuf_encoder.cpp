#include "tandem/monitor/protobuf_encoder.h"

#include <cstring>

namespace tandem::monitor {

void ProtobufEncoder::add_int64(int field, int64_t value) {
  append_key(field, WireType::kVarint);
  append_varint(static_cast<uint64_t>(value));
}

void ProtobufEncoder::add_double(int field, double value) {
  uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof bits);
  append_key(field, WireType::kFixed64);
  append_little_endian(bits, 8);
}

void ProtobufEncoder::add_float(int field, float value) {
  uint32_t bits = 0;
  std::memcpy(&bits, &value, sizeof bits);
  append_key(field, WireType::kFixed32);
  append_little_endian(bits, 4);
}

void ProtobufEncoder::add_bytes(int field, std::string_view bytes) {
  append_key(field, WireType::kLengthDelimited);
  append_varint(bytes.size());
  bytes_.append(bytes);
}

void ProtobufEncoder::append_key(int field, WireType type) {
  append_varint((static_cast<uint64_t>(field) << 3) | static_cast<uint64_t>(type));
}

// Seven bits per byte, least significant first; the high bit says another byte follows.
void ProtobufEncoder::append_varint(uint64_t value) {
  while (value >= 0x80) {
    bytes_.push_back(static_cast<char>((value & 0x7F) | 0x80));
    value >>= 7;
  }
  bytes_.push_back(static_cast<char>(value));
}

void ProtobufEncoder::append_little_endian(uint64_t value, int size) {
  for (int i = 0; i < size; ++i) bytes_.push_back(static_cast<char>((value >> (8 * i)) & 0xFF));
}

}  // namespace tandem::monitor
