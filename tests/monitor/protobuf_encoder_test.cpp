// The protobuf wire format, byte for byte, against the encodings in protobuf's own documentation
// (protobuf.dev/programming-guides/encoding).
#include "tandem/monitor/protobuf_encoder.h"

#include <gtest/gtest.h>

#include <string>

namespace tandem::monitor {
namespace {

std::string encoded(void (*add)(ProtobufEncoder&)) {
  ProtobufEncoder encoder;
  add(encoder);
  return encoder.bytes();
}

TEST(ProtobufEncoder, VarintsTakeSevenBitsPerByte) {
  EXPECT_EQ(encoded([](ProtobufEncoder& e) { e.add_int64(1, 150); }), std::string("\x08\x96\x01", 3));
  EXPECT_EQ(encoded([](ProtobufEncoder& e) { e.add_int64(2, 0); }), std::string("\x10\x00", 2));
  // Negative int64: two's complement over ten bytes.
  EXPECT_EQ(encoded([](ProtobufEncoder& e) { e.add_int64(2, -2); }),
            std::string("\x10\xFE\xFF\xFF\xFF\xFF\xFF\xFF\xFF\xFF\x01", 11));
  // A field number above 15 needs a two-byte key.
  EXPECT_EQ(encoded([](ProtobufEncoder& e) { e.add_int64(16, 1); }), std::string("\x80\x01\x01", 3));
}

TEST(ProtobufEncoder, DoublesAndFloatsAreLittleEndianIeee) {
  EXPECT_EQ(encoded([](ProtobufEncoder& e) { e.add_double(1, 1.0); }),
            std::string("\x09\x00\x00\x00\x00\x00\x00\xF0\x3F", 9));
  EXPECT_EQ(encoded([](ProtobufEncoder& e) { e.add_float(2, -2.5f); }), std::string("\x15\x00\x00\x20\xC0", 5));
}

TEST(ProtobufEncoder, BytesCarryTheirLength) {
  EXPECT_EQ(encoded([](ProtobufEncoder& e) { e.add_bytes(2, "testing"); }), std::string("\x12\x07testing", 9));
  // An embedded message is its own encoding, added as bytes: {a: 150} inside field 3.
  ProtobufEncoder inner;
  inner.add_int64(1, 150);
  ProtobufEncoder outer;
  outer.add_bytes(3, inner.bytes());
  EXPECT_EQ(outer.bytes(), std::string("\x1A\x03\x08\x96\x01", 5));
}

}  // namespace
}  // namespace tandem::monitor
