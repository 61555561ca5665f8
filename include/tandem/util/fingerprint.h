#pragma once
// A 64-bit fingerprint of bytes, for ranks to compare what they hold (a model description, a data set) by
// exchanging 8 bytes instead of the thing itself. Not cryptographic: it catches accidents, not forgeries.
#include <cstddef>
#include <cstdint>
#include <string>

namespace tandem {

class Fingerprint {
 public:
  Fingerprint& add(const void* data, size_t bytes);
  Fingerprint& add(const std::string& text) { return add(text.data(), text.size()); }
  Fingerprint& add(int64_t value) { return add(&value, sizeof(value)); }
  // Never 0, so that 0 can stand for "nothing" in an exchange.
  uint64_t value() const { return hash_ == 0 ? 1 : hash_; }

 private:
  uint64_t hash_ = 1469598103934665603ull;  // FNV-1a's offset basis
};

}  // namespace tandem
