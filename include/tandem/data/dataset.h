#pragma once
// The one interface the batch loader needs from a data set: its size and a batch for a list of indices.
// In-memory data sets (TensorDataset, MnistDataset) answer with index_select on their big tensors; data sets
// that decode files per sample (an image folder) build the batch sample by sample.
#include <torch/torch.h>

#include <cstdint>
#include <vector>

namespace tandem::data {

// A batch as the training loop consumes it. `data` and `target` have the batch as their first dimension.
// The last `padding_count` rows repeat earlier samples (DistributedSampler padding): a training step uses
// them like any other sample (as PyTorch does), evaluation counts only rows [0, real_count()).
struct Batch {
  torch::Tensor data;
  torch::Tensor target;
  std::vector<int64_t> indices;  // the data-set index of each row
  int64_t padding_count = 0;

  int64_t size() const { return static_cast<int64_t>(indices.size()); }
  int64_t real_count() const { return size() - padding_count; }
};

// Contract: get_batch is const and may be called from the loader's prefetch thread while the training thread
// uses the data set's other const methods, so it must not mutate shared state. It throws (InvalidArgument for
// an index out of range or unreadable sample); the loader hands the exception to the consumer.
class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  // Returns a Batch with data, target and indices filled (padding_count is the loader's to set). A data set
  // may drop rows it cannot read (ImageFolderDataset with skip_bad_images); the rows it keeps must be the
  // requested ones in the requested order, so the loader can tell which of them are padding.
  virtual Batch get_batch(const std::vector<int64_t>& indices) const = 0;
  // What ranks compare before training to be sure they read the same data (see data_agreement.h): equal on
  // two ranks exactly when their data sets hold the same samples in the same order, as far as it can tell.
  // 0 means "cannot tell", and then only the sizes are compared.
  virtual uint64_t fingerprint() const { return 0; }
};

}  // namespace tandem::data
