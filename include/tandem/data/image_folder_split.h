#pragma once
// An image folder's contents (the flower_photos layout: one sub-folder of JPEG/PNG files per class): its classes
// and samples, split into train and validation sets as the seeds' read_split_data does, and the class list file
// that maps labels back to folder names.
#include <cstdint>
#include <string>
#include <vector>

namespace tandem::data {

struct ImageSample {
  std::string path;
  int64_t label = 0;
};

struct ImageFolderSplit {
  std::vector<std::string> classes;  // sorted folder names; label i is classes[i]
  std::vector<ImageSample> train;
  std::vector<ImageSample> val;
};

// Classes are the sub-folders of `root` sorted by name (hidden ones skipped); images are the files ending in
// .jpg/.jpeg/.png (any case) in each, sorted by name. From each class, floor(count * val_split) images chosen by
// `seed` go to `val` (stratified: every class keeps its proportion), the rest to `train`; both lists are in
// class order, then file-name order. The same folder, val_split and seed always give the same split, and a
// class's split does not change when other classes are added. Throws InvalidArgument for a missing root, no
// class folders, a class folder without images, or val_split outside [0, 1).
ImageFolderSplit read_split_data(const std::string& root, double val_split = 0.2, uint64_t seed = 0);

// The class list as JSON {"0": "daisy", "1": "dandelion", ...} (the seeds' class_indices.json), for the run
// directory; read_class_list reads it back. Both throw Error naming the file on I/O failure.
void write_class_list(const std::vector<std::string>& classes, const std::string& path);
std::vector<std::string> read_class_list(const std::string& path);

}  // namespace tandem::data
