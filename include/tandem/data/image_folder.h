#pragma once
// An image-classification data set laid out as one sub-folder of JPEG/PNG files per class (the flower_photos
// layout), split into train and validation sets as the seeds' read_split_data does, decoded and augmented
// (image_transform.h) in worker threads (worker_pool.h).
#include <torch/torch.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tandem/data/dataset.h"
#include "tandem/data/image_transform.h"

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

struct ImageFolderOptions {
  ImageTransformOptions transform;
  // Threads decoding a batch's images in parallel (the calling thread helps too).
  int num_threads = 4;
  // false: an unreadable image fails get_batch with an error naming the file. true: such images are dropped
  // from their batch (the batch gets smaller) and counted in skipped_images().
  bool skip_bad_images = false;
  // Seeds the training augmentation; with set_epoch() it makes every sample's crop and flip reproducible,
  // whatever thread decodes it.
  uint64_t seed = 0;
};

class WorkerPool;

class ImageFolderDataset : public Dataset {
 public:
  ImageFolderDataset(std::vector<ImageSample> samples, ImageFolderOptions options);
  ~ImageFolderDataset() override;

  int64_t size() const override { return static_cast<int64_t>(samples_.size()); }
  // data [B, 3, S, S] float32 (normalised), target [B] int64, indices [B]; B < indices.size() only when
  // skip_bad_images dropped unreadable files. Safe to call from several threads at once.
  Batch get_batch(const std::vector<int64_t>& indices) const override;
  // Of each sample's "class folder/file name" and label, in order: the same on nodes that mount the data set
  // at different paths, different when one node's copy lacks or adds a file. File contents are not read.
  uint64_t fingerprint() const override;

  // One sample, transformed: [3, S, S]. Throws InvalidArgument naming the file if it cannot be decoded.
  torch::Tensor get_image(int64_t index) const;

  // Training augmentation draws depend on (seed, epoch, index): call once per epoch, like the sampler's.
  void set_epoch(int64_t epoch) { epoch_.store(epoch); }
  // Images dropped so far under skip_bad_images.
  int64_t skipped_images() const { return skipped_.load(); }

  const std::vector<ImageSample>& samples() const { return samples_; }
  const ImageFolderOptions& options() const { return options_; }

 private:
  // Decodes and transforms sample `index` into `out` (3 * S * S floats).
  void load_into(int64_t index, float* out) const;

  std::vector<ImageSample> samples_;
  ImageFolderOptions options_;
  std::unique_ptr<WorkerPool> pool_;
  std::atomic<int64_t> epoch_{0};
  mutable std::atomic<int64_t> skipped_{0};
};

}  // namespace tandem::data
