#include "support/tiny_mnist.h"

#include <cstdint>
#include <filesystem>
#include <fstream>

namespace tandem::testing {
namespace {

void write_be32(std::ofstream& out, uint32_t value) {
  const unsigned char bytes[4] = {static_cast<unsigned char>(value >> 24), static_cast<unsigned char>(value >> 16),
                                  static_cast<unsigned char>(value >> 8), static_cast<unsigned char>(value)};
  out.write(reinterpret_cast<const char*>(bytes), 4);
}

// `count` images whose label is a bright row in the picture; pixels otherwise pseudo-random but fixed.
void write_split(const std::string& dir, const std::string& prefix, int count, uint32_t salt) {
  std::ofstream images(dir + "/" + prefix + "-images-idx3-ubyte", std::ios::binary);
  std::ofstream labels(dir + "/" + prefix + "-labels-idx1-ubyte", std::ios::binary);
  write_be32(images, 0x00000803);
  write_be32(images, count);
  write_be32(images, 28);
  write_be32(images, 28);
  write_be32(labels, 0x00000801);
  write_be32(labels, count);
  uint32_t state = 12345 + salt;
  for (int i = 0; i < count; ++i) {
    const unsigned char label = static_cast<unsigned char>((i * 7 + salt) % 10);
    labels.put(static_cast<char>(label));
    for (int p = 0; p < 28 * 28; ++p) {
      state = state * 1664525u + 1013904223u;
      unsigned char pixel = static_cast<unsigned char>((state >> 24) / 4);
      if (p / 28 == 2 + 2 * label) pixel = 255;
      images.put(static_cast<char>(pixel));
    }
  }
}

}  // namespace

std::string write_tiny_mnist(const std::string& dir, int train_count, int test_count) {
  std::filesystem::create_directories(dir);
  write_split(dir, "train", train_count, 0);
  write_split(dir, "t10k", test_count, 3);
  return dir;
}

}  // namespace tandem::testing
