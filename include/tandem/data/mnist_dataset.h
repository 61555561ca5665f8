#pragma once
// MnistDataset: MNIST or Fashion-MNIST (same file names, same format) loaded from a folder into memory as
// images [N,1,28,28] float, scaled to [0,1] and normalised with a mean and std, and labels [N] int64.
// Files: train-images-idx3-ubyte / train-labels-idx1-ubyte and t10k-images-idx3-ubyte / t10k-labels-idx1-ubyte,
// each plain or with a .gz suffix (the dotted variant train-images.idx3-ubyte is accepted too).
#include <cstdint>
#include <string>

#include "tandem/data/tensor_dataset.h"

namespace tandem::data {

enum class MnistSplit { kTrain, kTest };

// "train" or "test" (also "t10k"); throws InvalidArgument otherwise.
MnistSplit parse_mnist_split(const std::string& name);
const char* mnist_split_name(MnistSplit split);

// True if `dir` holds a training images file under one of the names above (how `tandem train --data` tells an
// MNIST folder from an image folder).
bool has_mnist_files(const std::string& dir);

// The first existing file in `dir` among the names MNIST mirrors use for `stem` and `kind` ("train-images",
// "idx3": train-images-idx3-ubyte, its .gz, or the dotted train-images.idx3-ubyte[.gz]); "" when none exists.
std::string find_idx_file(const std::string& dir, const std::string& stem, const std::string& kind);

// x -> (x / 255 - mean) / std, as torchvision's ToTensor + Normalize.
struct Normalization {
  double mean = 0.0;
  double std = 1.0;
};
inline constexpr Normalization kFashionMnistNormalization{0.2860, 0.3530};
// MNIST and Fashion-MNIST label digits or garments 0-9.
inline constexpr int64_t kMnistClasses = 10;
inline constexpr Normalization kMnistNormalization{0.1307, 0.3081};

// Guesses from the folder name: a path containing "fashion" (any case) gets Fashion-MNIST's statistics, else one
// containing "mnist" gets MNIST's, else Fashion-MNIST's (tandem's default data set).
Normalization guess_normalization(const std::string& dir);
// Parses "MEAN,STD" (DataFolderOptions::normalization as text); throws InvalidArgument for anything else or std <= 0.
Normalization parse_normalization(const std::string& text);

class MnistDataset : public TensorDataset {
 public:
  // Loads both files of `split` from `dir`. Every label must lie in [0, num_classes): one damaged byte would
  // otherwise make a model with hundreds of classes. Throws InvalidArgument naming the file for a missing file,
  // bad magic, truncated or corrupt data, images and labels with different counts, a label out of range (with
  // its value and index), and for std <= 0.
  MnistDataset(const std::string& dir, MnistSplit split, Normalization normalization,
               int64_t num_classes = kMnistClasses);

  const torch::Tensor& images() const { return data(); }   // [N,1,rows,cols] float32, normalised
  const torch::Tensor& labels() const { return targets(); }  // [N] int64
  const std::string& images_path() const { return images_path_; }
  const std::string& labels_path() const { return labels_path_; }

 private:
  std::string images_path_;
  std::string labels_path_;
};

}  // namespace tandem::data
