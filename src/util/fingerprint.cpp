#include "tandem/util/fingerprint.h"

#include <cstring>

namespace tandem {

// FNV-1a's step over 8-byte words rather than bytes, so that hashing a data set's tensors (hundreds of MB)
// takes milliseconds; the tail goes byte by byte.
Fingerprint& Fingerprint::add(const void* data, size_t bytes) {
  constexpr uint64_t kPrime = 1099511628211ull;
  const uint64_t length = bytes;
  const auto* next = static_cast<const unsigned char*>(data);
  for (; bytes >= sizeof(uint64_t); bytes -= sizeof(uint64_t), next += sizeof(uint64_t)) {
    uint64_t word = 0;
    std::memcpy(&word, next, sizeof(word));
    hash_ = (hash_ ^ word) * kPrime;
  }
  for (; bytes > 0; --bytes, ++next) hash_ = (hash_ ^ *next) * kPrime;
  // The length ends each addition, so that ("ab", "c") and ("a", "bc") differ.
  hash_ = (hash_ ^ length) * kPrime;
  return *this;
}

}  // namespace tandem
