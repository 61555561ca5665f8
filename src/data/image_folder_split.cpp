#include "tandem/data/image_folder_split.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "tandem/data/seeded_random.h"
#include "tandem/util/atomic_file.h"
#include "tandem/util/error.h"

namespace tandem::data {
namespace fs = std::filesystem;
namespace {

bool is_image_file(const fs::path& path) {
  std::string ext = path.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return std::tolower(c); });
  return ext == ".jpg" || ext == ".jpeg" || ext == ".png";
}

// The visible sub-folders of `root`, sorted: the classes, label i being the i-th.
std::vector<std::string> list_classes(const std::string& root) {
  std::error_code error;
  if (!fs::is_directory(root, error)) {
    throw InvalidArgument("image folder " + root + " does not exist or is not a directory");
  }
  std::vector<std::string> classes;
  for (const auto& entry : fs::directory_iterator(root)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_directory() && !name.empty() && name[0] != '.') classes.push_back(name);
  }
  std::sort(classes.begin(), classes.end());
  if (classes.empty()) {
    throw InvalidArgument("image folder " + root + " has no class sub-folders; expected ROOT/CLASS/IMAGE.jpg");
  }
  return classes;
}

// The image files in one class folder, sorted by path.
std::vector<std::string> list_images(const fs::path& folder) {
  std::vector<std::string> files;
  for (const auto& entry : fs::directory_iterator(folder)) {
    if (entry.is_regular_file() && is_image_file(entry.path())) files.push_back(entry.path().string());
  }
  if (files.empty()) {
    throw InvalidArgument("class folder " + folder.string() + " holds no .jpg/.jpeg/.png images");
  }
  std::sort(files.begin(), files.end());
  return files;
}

// Which of a class's `count` files go to validation. Partial Fisher-Yates over positions picks them; seeded per
// class so other classes do not shift this one's split.
std::vector<bool> choose_validation(size_t count, double val_split, uint64_t seed, size_t label) {
  const auto val_count = static_cast<int64_t>(std::floor(count * val_split));
  std::vector<int64_t> order(count);
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(i);
  SeededRandom random{seed, static_cast<uint64_t>(label)};
  std::vector<bool> is_val(count, false);
  for (int64_t i = 0; i < val_count; ++i) {
    const int64_t j = i + random.below(static_cast<int64_t>(count) - i);
    std::swap(order[i], order[j]);
    is_val[order[i]] = true;
  }
  return is_val;
}

}  // namespace

ImageFolderSplit read_split_data(const std::string& root, double val_split, uint64_t seed) {
  if (!(val_split >= 0.0 && val_split < 1.0)) {
    throw InvalidArgument("val_split must be in [0, 1), got " + std::to_string(val_split));
  }
  ImageFolderSplit split;
  split.classes = list_classes(root);
  for (size_t label = 0; label < split.classes.size(); ++label) {
    const std::vector<std::string> files = list_images(fs::path(root) / split.classes[label]);
    const std::vector<bool> is_val = choose_validation(files.size(), val_split, seed, label);
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

}  // namespace tandem::data
