// CRC32C against published check values (RFC 3720's iSCSI vectors), and TensorFlow's mask on top of it.
#include "tandem/monitor/crc32c.h"

#include <gtest/gtest.h>

#include <string>

namespace tandem::monitor {
namespace {

uint32_t mask(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

TEST(Crc32c, MatchesTheStandardCheckValues) {
  EXPECT_EQ(crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(crc32c(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(crc32c(std::string(32, '\xFF')), 0x62A8AB43u);
  EXPECT_EQ(crc32c(""), 0u);
}

TEST(Crc32c, MaskedFormRotatesAndOffsetsTheCrc) {
  EXPECT_EQ(masked_crc32c("123456789"), mask(0xE3069283u));
  EXPECT_EQ(masked_crc32c(std::string(32, '\0')), mask(0x8A9136AAu));
  EXPECT_EQ(masked_crc32c(""), 0xa282ead8u);
}

}  // namespace
}  // namespace tandem::monitor
