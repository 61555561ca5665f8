#pragma once
// A small MNIST-format data set that tests train on in seconds: images whose label is drawn into the picture,
// so a model has something to learn.
#include <string>

namespace tandem::testing {

// Writes uncompressed IDX files for `train_count` training and `test_count` test images (28x28, labels 0..9)
// into `dir`, creating it; returns `dir`, for --data.
std::string write_tiny_mnist(const std::string& dir, int train_count, int test_count);

}  // namespace tandem::testing
