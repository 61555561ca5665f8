#pragma once
// CRC32C (Castagnoli), the checksum of TFRecord files such as TensorBoard's event files. TensorFlow stores it
// masked: a CRC computed over data that itself holds CRCs is weak, so the stored value is rotated and offset.
#include <cstdint>
#include <string_view>

namespace tandem::monitor {

// CRC32C of `bytes` (reflected polynomial 0x82F63B78, initial value and final xor 0xFFFFFFFF).
uint32_t crc32c(std::string_view bytes);

// TensorFlow's masked CRC32C, the form a TFRecord stores: ((crc >> 15) | (crc << 17)) + 0xa282ead8.
uint32_t masked_crc32c(std::string_view bytes);

}  // namespace tandem::monitor
