#include "tandem/data/mnist_dataset.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <filesystem>

#include "tandem/data/idx_file.h"
#include "tandem/util/error.h"

namespace tandem::data {
namespace {

constexpr uint32_t kImagesMagicDims = 3;
constexpr uint32_t kLabelsMagicDims = 1;

std::string find_file(const std::string& dir, const std::string& stem, const std::string& kind,
                      const std::string& what) {
  std::string path = find_idx_file(dir, stem, kind);
  if (!path.empty()) return path;
  const std::string dashed = (std::filesystem::path(dir) / (stem + "-" + kind + "-ubyte")).string();
  throw InvalidArgument(detail::concat("MNIST ", what, " not found: ", dashed,
                                       "[.gz] does not exist; point `dir` at a folder with MNIST-format files"));
}

std::string lowercase(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(), [](unsigned char c) { return std::tolower(c); });
  return text;
}

}  // namespace

std::string find_idx_file(const std::string& dir, const std::string& stem, const std::string& kind) {
  namespace fs = std::filesystem;
  const std::string dashed = stem + "-" + kind + "-ubyte";
  const std::string dotted = stem + "." + kind + "-ubyte";
  for (const std::string& name : {dashed, dashed + ".gz", dotted, dotted + ".gz"}) {
    const fs::path candidate = fs::path(dir) / name;
    std::error_code ignored;
    if (fs::is_regular_file(candidate, ignored)) return candidate.string();
  }
  return "";
}

bool has_mnist_files(const std::string& dir) { return !find_idx_file(dir, "train-images", "idx3").empty(); }

MnistSplit parse_mnist_split(const std::string& name) {
  if (name == "train") return MnistSplit::kTrain;
  if (name == "test" || name == "t10k") return MnistSplit::kTest;
  throw InvalidArgument("unknown MNIST split '" + name + "': use train or test");
}

const char* mnist_split_name(MnistSplit split) { return split == MnistSplit::kTrain ? "train" : "test"; }

Normalization guess_normalization(const std::string& dir) {
  const std::string name = lowercase(dir);
  if (name.find("fashion") != std::string::npos) return kFashionMnistNormalization;
  if (name.find("mnist") != std::string::npos) return kMnistNormalization;
  return kFashionMnistNormalization;
}

Normalization parse_normalization(const std::string& text) {
  const size_t comma = text.find(',');
  Normalization result;
  bool ok = comma != std::string::npos;
  if (ok) {
    const std::string mean_text = text.substr(0, comma);
    const std::string std_text = text.substr(comma + 1);
    char* end = nullptr;
    result.mean = std::strtod(mean_text.c_str(), &end);
    ok = !mean_text.empty() && *end == '\0';
    result.std = std::strtod(std_text.c_str(), &end);
    ok = ok && !std_text.empty() && *end == '\0';
  }
  if (!ok) throw InvalidArgument("`normalization` expects MEAN,STD (e.g. 0.2860,0.3530), got '" + text + "'");
  // A NaN mean trains on NaN pixels, and an infinite std on all-zero ones: both end in a loss with no remedy.
  if (!std::isfinite(result.mean) || !std::isfinite(result.std) || !(result.std > 0)) {
    throw InvalidArgument("`normalization`: MEAN must be finite and STD finite and > 0, got '" + text + "'");
  }
  return result;
}

MnistDataset::MnistDataset(const std::string& dir, MnistSplit split, Normalization normalization,
                           int64_t num_classes) {
  if (!(normalization.std > 0)) {
    throw InvalidArgument(detail::concat("MNIST normalisation std must be > 0, got ", normalization.std));
  }
  if (num_classes < 1) throw InvalidArgument(detail::concat("MNIST: ", num_classes, " classes; at least 1 is needed"));
  const std::string prefix = split == MnistSplit::kTrain ? "train" : "t10k";
  images_path_ = find_file(dir, prefix + "-images", "idx3", detail::concat(mnist_split_name(split), " images"));
  labels_path_ = find_file(dir, prefix + "-labels", "idx1", detail::concat(mnist_split_name(split), " labels"));

  IdxArray images = read_idx_file(images_path_);
  if (images.dims.size() != kImagesMagicDims) {
    throw InvalidArgument(detail::concat(images_path_, ": bad magic: an images file has 3 dimensions, this one has ",
                                         images.dims.size(), " (labels and images swapped?)"));
  }
  IdxArray labels = read_idx_file(labels_path_);
  if (labels.dims.size() != kLabelsMagicDims) {
    throw InvalidArgument(detail::concat(labels_path_, ": bad magic: a labels file has 1 dimension, this one has ",
                                         labels.dims.size(), " (labels and images swapped?)"));
  }
  const int64_t count = images.dims[0];
  if (labels.dims[0] != count) {
    throw InvalidArgument(detail::concat(images_path_, " holds ", count, " images but ", labels_path_, " holds ",
                                         labels.dims[0], " labels; the files do not belong together"));
  }
  const auto out_of_range = std::find_if(labels.values.begin(), labels.values.end(),
                                         [&](uint8_t label) { return label >= num_classes; });
  if (out_of_range != labels.values.end()) {
    throw InvalidArgument(detail::concat(
        labels_path_, ": label ", int{*out_of_range}, " at index ", out_of_range - labels.values.begin(),
        " is outside the ", num_classes, " classes 0-", num_classes - 1,
        "; the file is damaged (download it again), or pass `num_classes` if the data has more classes"));
  }
  const int64_t rows = images.dims[1];
  const int64_t cols = images.dims[2];
  // from_blob borrows the byte buffers; the conversions below copy into tensors that own their memory.
  torch::Tensor pixels = torch::from_blob(images.values.data(), {count, 1, rows, cols}, torch::kUInt8);
  torch::Tensor image_tensor = pixels.to(torch::kFloat32)
                                   .div_(255.0)
                                   .sub_(normalization.mean)
                                   .div_(normalization.std);
  torch::Tensor label_tensor = torch::from_blob(labels.values.data(), {count}, torch::kUInt8).to(torch::kInt64);
  reset(std::move(image_tensor), std::move(label_tensor));
}

}  // namespace tandem::data
