#include "support/tiny_datasets.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <vector>

#include "tandem/data/tensor_dataset.h"
#include "tandem/data/image.h"

namespace tandem::testing {
namespace {

void write_be32(std::ofstream& out, uint32_t value) {
  const unsigned char bytes[4] = {static_cast<unsigned char>(value >> 24), static_cast<unsigned char>(value >> 16),
                                  static_cast<unsigned char>(value >> 8), static_cast<unsigned char>(value)};
  out.write(reinterpret_cast<const char*>(bytes), 4);
}

// IDX files (uncompressed) for `count` 28x28 images whose label is drawn into the picture as a bright row, so
// the CNN has something to learn; pixels otherwise pseudo-random but fixed.
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

std::string make_temp_dir(const std::string& name) {
  std::string dir = ::testing::TempDir() + "tandem_test_" + std::to_string(::getpid()) + "_" + name;
  ::mkdir(dir.c_str(), 0755);
  return dir;
}

std::string write_tiny_mnist(const std::string& name, int train_count, int test_count) {
  const std::string dir = make_temp_dir(name);
  write_split(dir, "train", train_count, 0);
  write_split(dir, "t10k", test_count, 3);
  return dir;
}

// CLASS/img<i>.png for 3 classes of `per_class` 20x16 RGB images; each class has its own colour, so a few steps
// have something to learn.
std::string write_tiny_image_folder(const std::string& name, int per_class) {
  const std::string root = make_temp_dir(name);
  const char* classes[] = {"circle", "square", "triangle"};
  for (int c = 0; c < 3; ++c) {
    std::filesystem::create_directories(root + "/" + classes[c]);
    for (int i = 0; i < per_class; ++i) {
      std::vector<uint8_t> pixels(20 * 16 * 3);
      for (size_t p = 0; p < pixels.size(); ++p) {
        pixels[p] = static_cast<uint8_t>(p % 3 == static_cast<size_t>(c) ? 200 : (p * 7 + i) % 64);
      }
      data::write_png(root + "/" + classes[c] + "/img" + std::to_string(i) + ".png", pixels.data(), 20, 16, 3);
    }
  }
  return root;
}

std::shared_ptr<const data::Dataset> separable_set(int64_t count, uint64_t seed) {
  torch::manual_seed(seed);
  torch::Tensor x = torch::randn({count, 8});
  return std::make_shared<data::TensorDataset>(x, (x.sum(1) > 0).to(torch::kLong));
}

}  // namespace tandem::testing
