#pragma once
// Small data sets written by tests: MNIST-format IDX files and an image folder, each with something a few
// steps can learn, so that `tandem train` processes run in seconds.
#include <string>

namespace tandem::testing {

// A fresh folder under the test temp dir, unique to this process and `name`.
std::string make_temp_dir(const std::string& name);

// train-*/t10k-* IDX files (uncompressed) of 28x28 images whose label is drawn into the picture as a bright row.
std::string write_tiny_mnist(const std::string& name, int train_count, int test_count);

// CLASS/img<i>.png for 3 classes of `per_class` 20x16 RGB images; each class has its own colour.
std::string write_tiny_image_folder(const std::string& name, int per_class);

}  // namespace tandem::testing
