#pragma once
// An image-classification data set over one side of an image folder's split (image_folder_split.h): samples
// decoded, transformed (image_transform.h) and batched in worker threads (worker_pool.h).
#include <torch/torch.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "tandem/data/dataset.h"
#include "tandem/data/image_folder_split.h"
#include "tandem/data/image_transform.h"

namespace tandem::data {

struct ImageFolderOptions {
  ImageTransformOptions transform;
  // Threads decoding a batch's images in parallel (the calling thread helps too).
  int num_threads = 4;
  // false: an unreadable image fails get_batch with an error naming the file. true: such images are dropped
  // from their batch (the batch gets smaller) and counted in skipped_images(); a batch that loses every image
  // after some image of the set was read comes back with no rows and is counted in emptied_batches() (the loop
  // still runs it through the model, so that its rank joins the step's collectives with a zero gradient); but a
  // batch that loses every image before any image of the set was read fails get_batch too, as a folder of
  // unreadable images leaves nothing to train on.
  bool skip_bad_images = false;
  // Seeds the training augmentation; with set_epoch() it makes every sample's crop and flip reproducible,
  // whatever thread decodes it.
  uint64_t seed = 0;
};

class WorkerPool;
class ImageBatchBuffers;

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
  // Batches that skip_bad_images left with no rows, so far.
  int64_t emptied_batches() const { return emptied_.load(); }

  const std::vector<ImageSample>& samples() const { return samples_; }
  const ImageFolderOptions& options() const { return options_; }

 private:
  // Throws InvalidArgument unless 0 <= index < size().
  void check_index(int64_t index) const;
  // Decodes and transforms sample `index` into `out` (3 * S * S floats).
  void load_into(int64_t index, float* out) const;

  std::vector<ImageSample> samples_;
  ImageFolderOptions options_;
  std::unique_ptr<WorkerPool> pool_;
  // Where get_batch's tensors live (image_batch_buffers.h).
  std::shared_ptr<ImageBatchBuffers> batch_buffers_;
  std::atomic<int64_t> epoch_{0};
  mutable std::atomic<int64_t> skipped_{0};
  mutable std::atomic<int64_t> emptied_{0};
  // Images get_batch read: while none has been, a batch that skip_bad_images empties ends the run.
  mutable std::atomic<int64_t> loaded_{0};
};

}  // namespace tandem::data
