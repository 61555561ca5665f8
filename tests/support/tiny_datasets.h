#pragma once
// Small data sets written by tests: MNIST-format IDX files and an image folder, each with something a few
// steps can learn, so that `tandem train` processes run in seconds.
#include <cstdint>
#include <memory>
#include <string>

#include "tandem/data/dataset.h"

namespace tandem::testing {

// A fresh folder under the test temp dir, unique to this process and `name`.
std::string make_temp_dir(const std::string& name);

// train-*/t10k-* IDX files (uncompressed) of 28x28 images whose label is drawn into the picture as a bright row.
std::string write_tiny_mnist(const std::string& name, int train_count, int test_count);

// CLASS/img<i>.png for 3 classes of `per_class` 20x16 RGB images; each class has its own colour.
std::string write_tiny_image_folder(const std::string& name, int per_class);

// `count` samples of 8 features, labelled by the sign of their sum (a few steps learn it), drawn from `seed`.
std::shared_ptr<const data::Dataset> separable_set(int64_t count, uint64_t seed);

}  // namespace tandem::testing
