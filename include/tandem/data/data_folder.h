#pragma once
// What `tandem train --data DIR` opens: a folder of MNIST files (train-/t10k- IDX images and labels; evaluation
// on t10k) or an image folder (one sub-folder of .jpg/.png images per class; evaluation on a stratified
// val_split of it, see image_folder.h), told apart by what the folder holds.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tandem/data/dataset.h"
#include "tandem/data/image_folder.h"
#include "tandem/data/mnist_dataset.h"

namespace tandem::data {

struct DataFolderOptions {
  std::string dir;
  std::optional<Normalization> normalization;  // MNIST only; unset: guessed from the folder's name
  // Labels lie below it, and the model has as many outputs. 0: kMnistClasses for MNIST files (whose labels must
  // then be 0-9), the class folders of an image folder (which refuses fewer than it has).
  int64_t num_classes = 0;
  // Image folders only: MNIST files are used as they are and evaluate on their t10k files, so they refuse a set
  // val_split or min_crop_scale, and an image_size other than their own, rather than ignore it. image_size 0:
  // 224; val_split unset: 0.2; min_crop_scale 0: by image size (crop_defaults.h).
  int64_t image_size = 0;
  std::optional<double> val_split;
  double min_crop_scale = 0;
  bool skip_bad_images = false;
  uint64_t seed = 0;  // the validation split and the augmentation
};

struct DataFolder {
  bool is_mnist = false;
  std::shared_ptr<const Dataset> train, eval;
  std::shared_ptr<ImageFolderDataset> image_train;  // image folders: the training set, for set_epoch
  std::vector<std::string> classes;                  // image folders: label i's folder name
  // The samples' shape, for the model: [in_channels, image_size, image_size], labels below num_classes.
  int64_t in_channels = 1;
  int64_t image_size = 28;
  int64_t num_classes = 10;
};

// Opens `options.dir` and resolves options' data-dependent defaults (num_classes, normalization, image_size,
// val_split, min_crop_scale) in place, so that every rank and the printed configuration see the same values.
// Throws InvalidArgument naming the folder when it holds neither kind; naming `val_split` or `min_crop_scale` set
// for MNIST files, or `image_size` for MNIST files of another size; or `num_classes` for fewer than an image
// folder's classes.
DataFolder open_data_folder(DataFolderOptions& options);

}  // namespace tandem::data
