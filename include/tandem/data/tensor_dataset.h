#pragma once
// TensorDataset: a data set held in memory as two tensors whose first dimension is the sample, e.g. images
// [N,1,28,28] float and labels [N] int64. A batch is one index_select per tensor (contiguous, ready to train).
#include <torch/torch.h>

#include "tandem/data/dataset.h"

namespace tandem::data {

class TensorDataset : public Dataset {
 public:
  // Throws InvalidArgument when the first dimensions differ or either tensor is undefined or 0-dimensional.
  TensorDataset(torch::Tensor data, torch::Tensor targets);

  int64_t size() const override { return data_.size(0); }
  // Throws InvalidArgument naming the first index outside [0, size()).
  Batch get_batch(const std::vector<int64_t>& indices) const override;
  // Of every byte of data and targets (a few milliseconds per 100 MB).
  uint64_t fingerprint() const override;

  const torch::Tensor& data() const { return data_; }
  const torch::Tensor& targets() const { return targets_; }

 protected:
  TensorDataset() = default;  // for subclasses that load first, then call reset()
  void reset(torch::Tensor data, torch::Tensor targets);

 private:
  torch::Tensor data_;
  torch::Tensor targets_;
};

}  // namespace tandem::data
