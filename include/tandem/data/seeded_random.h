#pragma once
// The random draws behind the image folder's validation split and training augmentation. They are keyed, not
// sequential: a draw depends only on its keys (seed, class; or seed, epoch, sample index), so that the result
// does not depend on which thread or rank makes it, or in which order.
#include <cstdint>
#include <initializer_list>

namespace tandem::data {

// SplitMix64: a tiny, portable generator, so splits and augmentations are the same on every platform
// (std::uniform_*_distribution is implementation-defined). Changing any constant here changes every split and
// every augmented image.
class SeededRandom {
 public:
  explicit SeededRandom(std::initializer_list<uint64_t> keys) {
    for (uint64_t key : keys) {
      state_ ^= key;
      next();
    }
  }
  uint64_t next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  // Uniform in [low, high), from the top 53 bits.
  double uniform(double low, double high) { return low + (high - low) * (next() >> 11) * 0x1.0p-53; }
  // In [0, n) for n > 0. Slightly biased for huge n; removing the bias would change every existing split.
  int64_t below(int64_t n) { return static_cast<int64_t>(next() % static_cast<uint64_t>(n)); }

 private:
  uint64_t state_ = 0x243F6A8885A308D3ULL;
};

}  // namespace tandem::data
