#include "tandem/data/image_folder.h"

#include <fmt/format.h>

#include <algorithm>
#include <exception>
#include <filesystem>

#include "tandem/data/image.h"
#include "tandem/data/image_batch_buffers.h"
#include "tandem/data/seeded_random.h"
#include "tandem/data/worker_pool.h"
#include "tandem/util/error.h"
#include "tandem/util/fingerprint.h"

namespace tandem::data {
ImageFolderDataset::ImageFolderDataset(std::vector<ImageSample> samples, ImageFolderOptions options)
    : samples_(std::move(samples)), options_(std::move(options)) {
  check_image_transform_options(options_.transform);
  pool_ = std::make_unique<WorkerPool>(std::max(0, options_.num_threads - 1));
  batch_buffers_ = ImageBatchBuffers::create();
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
  const EncodedImage encoded = read_encoded_image(samples_[index].path);
  // Keyed by (seed, epoch, index) alone, so the draws do not depend on the thread, the batch or the rank.
  SeededRandom random{options_.seed, static_cast<uint64_t>(epoch_.load()), static_cast<uint64_t>(index)};
  // The crop is drawn on the declared size before decoding, so that a JPEG is decoded only as large as the
  // crop needs.
  const CropPlan crop = plan_crop(encoded.width, encoded.height, options_.transform, random);
  const Image image = decode_image(encoded, dct_reduction(crop, options_.transform.image_size));
  render_crop(image, encoded.width, encoded.height, crop, options_.transform, out);
}

void ImageFolderDataset::check_index(int64_t index) const {
  if (index < 0 || index >= size()) {
    throw InvalidArgument("image index " + std::to_string(index) + " out of range [0, " + std::to_string(size()) + ")");
  }
}

torch::Tensor ImageFolderDataset::get_image(int64_t index) const {
  check_index(index);
  const int64_t s = options_.transform.image_size;
  torch::Tensor out = torch::empty({3, s, s}, torch::kFloat);
  load_into(index, out.data_ptr<float>());
  return out;
}

Batch ImageFolderDataset::get_batch(const std::vector<int64_t>& indices) const {
  const int64_t count = static_cast<int64_t>(indices.size()), s = options_.transform.image_size;
  for (int64_t index : indices) check_index(index);
  torch::Tensor data = batch_buffers_->take({count, 3, s, s});
  float* base = data.data_ptr<float>();
  std::vector<std::exception_ptr> failures(static_cast<size_t>(count));
  pool_->parallel_for(count, [&](int64_t i) {
    try {
      load_into(indices[i], base + i * 3 * s * s);
    } catch (...) {
      failures[i] = std::current_exception();
    }
  });

  // Failures are handled in batch order, so the error reported is the first bad file's whatever thread met it.
  Batch batch;
  std::vector<int64_t> kept_rows, targets;
  for (int64_t i = 0; i < count; ++i) {
    if (failures[i]) {
      if (!options_.skip_bad_images) std::rethrow_exception(failures[i]);
      ++skipped_;
      continue;
    }
    ++loaded_;
    kept_rows.push_back(i);
    batch.indices.push_back(indices[i]);
    targets.push_back(samples_[indices[i]].label);
  }
  if (kept_rows.empty() && count > 0 && loaded_.load() == 0) {
    // SAMPLE = FOLDER/CLASS/FILE
    const auto folder = std::filesystem::path(samples_[indices.front()].path).parent_path().parent_path();
    throw InvalidArgument(fmt::format("the first {} images read from {} were all unreadable, and `skip_bad_images` "
                                      "leaves nothing to train on; check the images (without `skip_bad_images` the "
                                      "first bad one is named)",
                                      skipped_.load(), folder.string()));
  }
  if (kept_rows.empty() && count > 0) ++emptied_;
  batch.data = static_cast<int64_t>(kept_rows.size()) == count
                   ? data
                   : data.index_select(0, torch::tensor(kept_rows, torch::kLong));
  batch.target = torch::tensor(targets, torch::kLong);
  return batch;
}

}  // namespace tandem::data
