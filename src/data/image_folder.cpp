#include "tandem/data/image_folder.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <exception>
#include <filesystem>
#include <fstream>

#include "tandem/data/image.h"
#include "tandem/data/seeded_random.h"
#include "tandem/data/worker_pool.h"
#include "tandem/util/error.h"
#include "tandem/util/fingerprint.h"
#include "tandem/util/atomic_file.h"

namespace tandem::data {
namespace fs = std::filesystem;

namespace {

bool is_image_file(const fs::path& path) {
  std::string ext = path.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
  return ext == ".jpg" || ext == ".jpeg" || ext == ".png";
}

}  // namespace

ImageFolderSplit read_split_data(const std::string& root, double val_split, uint64_t seed) {
  if (!(val_split >= 0.0 && val_split < 1.0)) {
    throw InvalidArgument("val_split must be in [0, 1), got " + std::to_string(val_split));
  }
  std::error_code error;
  if (!fs::is_directory(root, error)) {
    throw InvalidArgument("image folder " + root + " does not exist or is not a directory");
  }
  ImageFolderSplit split;
  for (const auto& entry : fs::directory_iterator(root)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_directory() && !name.empty() && name[0] != '.') split.classes.push_back(name);
  }
  std::sort(split.classes.begin(), split.classes.end());
  if (split.classes.empty()) {
    throw InvalidArgument("image folder " + root + " has no class sub-folders; expected ROOT/CLASS/IMAGE.jpg");
  }
  for (size_t label = 0; label < split.classes.size(); ++label) {
    const fs::path folder = fs::path(root) / split.classes[label];
    std::vector<std::string> files;
    for (const auto& entry : fs::directory_iterator(folder)) {
      if (entry.is_regular_file() && is_image_file(entry.path())) files.push_back(entry.path().string());
    }
    if (files.empty()) {
      throw InvalidArgument("class folder " + folder.string() + " holds no .jpg/.jpeg/.png images");
    }
    std::sort(files.begin(), files.end());
    // Partial Fisher-Yates over positions picks the validation files; seeded per class so other classes
    // do not shift this one's split.
    const auto val_count = static_cast<int64_t>(std::floor(files.size() * val_split));
    std::vector<int64_t> order(files.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(i);
    SeededRandom random{seed, static_cast<uint64_t>(label)};
    std::vector<bool> is_val(files.size(), false);
    for (int64_t i = 0; i < val_count; ++i) {
      const int64_t j = i + random.below(static_cast<int64_t>(files.size()) - i);
      std::swap(order[i], order[j]);
      is_val[order[i]] = true;
    }
    for (size_t i = 0; i < files.size(); ++i) {
      (is_val[i] ? split.val : split.train).push_back({files[i], static_cast<int64_t>(label)});
    }
  }
  return split;
}

void write_class_list(const std::vector<std::string>& classes, const std::string& path) {
  nlohmann::ordered_json json = nlohmann::ordered_json::object();
  for (size_t i = 0; i < classes.size(); ++i) json[std::to_string(i)] = classes[i];
  write_file_atomically(path, json.dump(4) + "\n");
}

std::vector<std::string> read_class_list(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error("cannot read class list " + path);
  nlohmann::json json;
  try {
    in >> json;
  } catch (const nlohmann::json::exception& e) {
    throw Error("class list " + path + " is not valid JSON: " + e.what());
  }
  std::vector<std::string> classes(json.size());
  for (auto& [key, value] : json.items()) {
    const size_t index = std::stoul(key);
    if (index >= classes.size() || !value.is_string()) throw Error("class list " + path + " has a bad entry " + key);
    classes[index] = value.get<std::string>();
  }
  return classes;
}

ImageFolderDataset::ImageFolderDataset(std::vector<ImageSample> samples, ImageFolderOptions options)
    : samples_(std::move(samples)), options_(std::move(options)) {
  check_image_transform_options(options_.transform);
  pool_ = std::make_unique<WorkerPool>(std::max(0, options_.num_threads - 1));
}

// Out of line: WorkerPool is complete only here.
ImageFolderDataset::~ImageFolderDataset() = default;

uint64_t ImageFolderDataset::fingerprint() const {
  Fingerprint fingerprint;
  for (const ImageSample& sample : samples_) {
    const std::filesystem::path path(sample.path);
    fingerprint.add((path.parent_path().filename() / path.filename()).string()).add(sample.label);
  }
  return fingerprint.value();
}

void ImageFolderDataset::load_into(int64_t index, float* out) const {
  const Image image = read_image(samples_[index].path);
  // Keyed by (seed, epoch, index) alone, so the draws do not depend on the thread, the batch or the rank.
  SeededRandom random{options_.seed, static_cast<uint64_t>(epoch_.load()), static_cast<uint64_t>(index)};
  transform_image(image, options_.transform, random, out);
}

torch::Tensor ImageFolderDataset::get_image(int64_t index) const {
  if (index < 0 || index >= size()) {
    throw InvalidArgument("image index " + std::to_string(index) + " out of range [0, " + std::to_string(size()) + ")");
  }
  const int64_t s = options_.transform.image_size;
  torch::Tensor out = torch::empty({3, s, s}, torch::kFloat);
  load_into(index, out.data_ptr<float>());
  return out;
}

Batch ImageFolderDataset::get_batch(const std::vector<int64_t>& indices) const {
  const int64_t count = static_cast<int64_t>(indices.size()), s = options_.transform.image_size;
  for (int64_t index : indices) {
    if (index < 0 || index >= size()) {
      throw InvalidArgument("image index " + std::to_string(index) + " out of range [0, " + std::to_string(size()) +
                            ")");
    }
  }
  torch::Tensor data = torch::empty({count, 3, s, s}, torch::kFloat);
  float* base = data.data_ptr<float>();
  std::vector<std::exception_ptr> failures(static_cast<size_t>(count));
  pool_->parallel_for(count, [&](int64_t i) {
    try {
      load_into(indices[i], base + i * 3 * s * s);
    } catch (...) {
      failures[i] = std::current_exception();
    }
  });

  Batch batch;
  std::vector<int64_t> kept_rows;
  for (int64_t i = 0; i < count; ++i) {
    if (!failures[i]) {
      kept_rows.push_back(i);
      continue;
    }
    if (!options_.skip_bad_images) std::rethrow_exception(failures[i]);
    ++skipped_;
  }
  std::vector<int64_t> targets;
  for (int64_t row : kept_rows) {
    batch.indices.push_back(indices[row]);
    targets.push_back(samples_[indices[row]].label);
  }
  batch.data = static_cast<int64_t>(kept_rows.size()) == count
                   ? data
                   : data.index_select(0, torch::tensor(kept_rows, torch::kLong));
  batch.target = torch::tensor(targets, torch::kLong);
  return batch;
}

}  // namespace tandem::data
