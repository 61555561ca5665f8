#include "tandem/data/data_folder.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <filesystem>

#include "tandem/data/crop_defaults.h"
#include "tandem/util/error.h"

namespace tandem::data {
namespace {

bool is_image_folder(const std::string& dir) {
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(dir, error)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_directory(error) && !name.empty() && name[0] != '.') return true;
  }
  return false;
}

// MNIST files' own split and pixels leave an image folder's options nothing to do; a set one is refused, not
// ignored, as the user asked for something the run would not do.
void refuse_image_folder_options(const DataFolderOptions& o) {
  if (o.val_split) {
    throw InvalidArgument(fmt::format("`val_split` {}: {} holds MNIST files, which evaluate on their t10k files; "
                                      "drop `val_split`, or export an image folder (tandem export-images DIR) to "
                                      "hold out part of the training images",
                                      *o.val_split, o.dir));
  }
  if (o.min_crop_scale != 0) {
    throw InvalidArgument(fmt::format("`min_crop_scale` {}: {} holds MNIST files, which train on whole images "
                                      "without random crops; drop `min_crop_scale`, or export an image folder "
                                      "(tandem export-images DIR) to train on crops",
                                      o.min_crop_scale, o.dir));
  }
  if (o.skip_bad_images) {
    throw InvalidArgument(fmt::format("`skip_bad_images`: {} holds MNIST files, whose images are read whole from "
                                      "their IDX files, with no image file to skip; drop `skip_bad_images`",
                                      o.dir));
  }
}

DataFolder open_mnist_files(DataFolderOptions& o) {
  refuse_image_folder_options(o);
  DataFolder d;
  d.is_mnist = true;
  if (!o.normalization) o.normalization = guess_normalization(o.dir);
  if (o.num_classes == 0) o.num_classes = kMnistClasses;
  d.num_classes = o.num_classes;
  auto train_set = std::make_shared<MnistDataset>(o.dir, MnistSplit::kTrain, *o.normalization, d.num_classes);
  d.eval = std::make_shared<MnistDataset>(o.dir, MnistSplit::kTest, *o.normalization, d.num_classes);
  const int64_t side = train_set->images().size(2);
  if (o.image_size != 0 && o.image_size != side) {
    throw InvalidArgument(fmt::format("`image_size` {}: {} holds MNIST files of {}x{} images, which are used as "
                                      "they are; drop `image_size`, or export an image folder (tandem "
                                      "export-images DIR) to train at another size",
                                      o.image_size, o.dir, side, side));
  }
  d.in_channels = train_set->images().size(1);
  d.image_size = side;
  d.train = train_set;
  return d;
}

DataFolder open_image_folder(DataFolderOptions& o) {
  // The image transform normalises with ImageNet's statistics (image_transform.h); MNIST's MEAN,STD is no
  // setting of it.
  if (o.normalization) {
    throw InvalidArgument(fmt::format("`normalization` {},{}: {} is an image folder, whose images are normalised "
                                      "with ImageNet's mean and std per channel; drop `normalization`, which is "
                                      "for MNIST files",
                                      o.normalization->mean, o.normalization->std, o.dir));
  }
  DataFolder d;
  if (!o.val_split) o.val_split = 0.2;
  ImageFolderSplit split = read_split_data(o.dir, *o.val_split, o.seed);
  const auto classes = static_cast<int64_t>(split.classes.size());
  if (o.num_classes == 0) o.num_classes = classes;
  if (o.num_classes < classes) {
    throw InvalidArgument(
        fmt::format("`num_classes` {} is fewer than the {} classes in {}", o.num_classes, classes, o.dir));
  }
  if (o.image_size == 0) o.image_size = 224;
  if (o.min_crop_scale == 0) o.min_crop_scale = default_min_crop_scale(o.image_size);
  ImageFolderOptions folder;
  folder.transform.image_size = o.image_size;
  folder.transform.min_crop_scale = o.min_crop_scale;
  folder.transform.resize_ratio = default_val_resize_ratio(o.image_size);
  folder.num_threads = std::max(1, torch::get_num_threads());
  folder.skip_bad_images = o.skip_bad_images;
  folder.seed = o.seed;
  ImageFolderOptions eval_folder = folder;
  folder.transform.train = true;
  d.image_train = std::make_shared<ImageFolderDataset>(std::move(split.train), folder);
  d.eval = std::make_shared<ImageFolderDataset>(std::move(split.val), eval_folder);
  d.train = d.image_train;
  d.in_channels = 3;
  d.image_size = o.image_size;
  d.num_classes = classes;
  d.classes = std::move(split.classes);
  return d;
}

}  // namespace

DataFolder open_data_folder(DataFolderOptions& options) {
  if (has_mnist_files(options.dir)) return open_mnist_files(options);
  if (is_image_folder(options.dir)) return open_image_folder(options);
  throw InvalidArgument(fmt::format(
      "`dir` {} {}; expected MNIST files (train-images-idx3-ubyte[.gz] and the other three) or an image folder "
      "(one sub-folder of .jpg/.png images per class)",
      options.dir, std::filesystem::exists(options.dir) ? "holds neither" : "does not exist"));
}

}  // namespace tandem::data
