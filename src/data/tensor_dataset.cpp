#include "tandem/data/tensor_dataset.h"

#include "tandem/util/error.h"
#include "tandem/util/fingerprint.h"

namespace tandem::data {

TensorDataset::TensorDataset(torch::Tensor data, torch::Tensor targets) { reset(std::move(data), std::move(targets)); }

void TensorDataset::reset(torch::Tensor data, torch::Tensor targets) {
  if (!data.defined() || !targets.defined() || data.dim() == 0 || targets.dim() == 0) {
    throw InvalidArgument("TensorDataset: data and targets must be defined tensors with a sample dimension");
  }
  if (data.size(0) != targets.size(0)) {
    throw InvalidArgument(detail::concat("TensorDataset: data has ", data.size(0), " samples but targets have ",
                                         targets.size(0)));
  }
  data_ = std::move(data);
  targets_ = std::move(targets);
}

Batch TensorDataset::get_batch(const std::vector<int64_t>& indices) const {
  const int64_t n = size();
  for (int64_t index : indices) {
    if (index < 0 || index >= n) {
      throw InvalidArgument(detail::concat("TensorDataset: sample index ", index, " is outside [0, ", n, ")"));
    }
  }
  // from_blob does not copy; index_select copies the selected rows out before `indices` goes away.
  torch::Tensor selector = torch::from_blob(const_cast<int64_t*>(indices.data()),
                                            {static_cast<int64_t>(indices.size())}, torch::kLong)
                                .to(data_.device());
  Batch batch;
  batch.data = data_.index_select(0, selector);
  batch.target = targets_.index_select(0, selector.to(targets_.device()));
  batch.indices = indices;
  return batch;
}

uint64_t TensorDataset::fingerprint() const {
  Fingerprint fingerprint;
  for (const torch::Tensor& tensor : {data_, targets_}) {
    const torch::Tensor bytes = tensor.contiguous().cpu();
    for (int64_t size : bytes.sizes()) fingerprint.add(size);
    fingerprint.add(static_cast<int64_t>(bytes.scalar_type()));
    fingerprint.add(bytes.data_ptr(), bytes.nbytes());
  }
  return fingerprint.value();
}

}  // namespace tandem::data
