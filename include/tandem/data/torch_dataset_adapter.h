#pragma once
// TorchDatasetAdapter: any LibTorch data set with random access (a class deriving from
// torch::data::datasets::Dataset<Self>, torch::data::datasets::MNIST, either one .map()ped) as a tandem
// Dataset, so tandem's BatchLoader, with its DistributedSampler order, padding counts and prefetch thread, reads
// it. The examples must be torch::data::Example<> (data and target tensors); the adapter stacks a batch's
// examples into Batch{data, target, indices}, the first dimension being the batch. A data set whose batches
// come out already stacked (.map(torch::data::transforms::Stack<>())) is taken as it is.
//
// Usage, on every rank:
//   std::shared_ptr<const Dataset> dataset = make_dataset(torch::data::datasets::MNIST(root));
//   BatchLoader loader(dataset, BatchSampler(DistributedSampler(dataset->size(), {world, rank, true, seed}), 64));
//
// Threading: a torch data set's get() is not const and need not be thread-safe, while tandem's get_batch is
// const and runs on the loader's prefetch thread. The adapter owns its copy of the data set and lets one
// get_batch at a time into it (a mutex), so one loader, or several sharing the adapter, read it safely. The
// caller must not use that data set elsewhere at the same time: a copy that shares state with it (through a
// shared_ptr member, say) is the caller's to keep quiet.
#include <torch/torch.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <type_traits>
#include <utility>
#include <vector>

#include "tandem/data/dataset.h"
#include "tandem/util/error.h"

namespace tandem::data {

template <typename TorchDataset>
class TorchDatasetAdapter final : public Dataset {
  static_assert(std::is_same_v<typename TorchDataset::BatchRequestType, torch::ArrayRef<size_t>>,
                "TorchDatasetAdapter needs a data set with random access: get_batch(ArrayRef<size_t>), not a "
                "stream or a stateful (chunk) data set");
  using TorchBatch = typename TorchDataset::BatchType;
  static_assert(std::is_same_v<TorchBatch, std::vector<torch::data::Example<>>> ||
                    std::is_same_v<TorchBatch, torch::data::Example<>>,
                "TorchDatasetAdapter needs examples of type torch::data::Example<> (data and target tensors)");

 public:
  // Throws InvalidArgument when the data set does not know its size (size() is nullopt): tandem's samplers
  // split 0..size-1 among the ranks.
  explicit TorchDatasetAdapter(TorchDataset dataset) : dataset_(std::move(dataset)) {
    const auto size = dataset_.size();
    if (!size.has_value()) {
      throw InvalidArgument(
          "TorchDatasetAdapter: the torch data set does not know its size (size() returned nullopt); tandem's "
          "samplers need it to split the indices among ranks");
    }
    size_ = static_cast<int64_t>(*size);
  }

  int64_t size() const override { return size_; }

  // Throws InvalidArgument naming the first index outside [0, size()); rethrows what the data set throws.
  Batch get_batch(const std::vector<int64_t>& indices) const override {
    std::vector<size_t> request;
    request.reserve(indices.size());
    for (int64_t index : indices) {
      if (index < 0 || index >= size_) {
        throw InvalidArgument(
            detail::concat("TorchDatasetAdapter: sample index ", index, " is outside [0, ", size_, ")"));
      }
      request.push_back(static_cast<size_t>(index));
    }
    TorchBatch examples;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      examples = dataset_.get_batch(request);
    }
    torch::data::Example<> stacked;
    if constexpr (std::is_same_v<TorchBatch, torch::data::Example<>>) {
      stacked = std::move(examples);
    } else {
      stacked = torch::data::transforms::Stack<>().apply_batch(std::move(examples));
    }
    Batch batch;
    batch.data = std::move(stacked.data);
    batch.target = std::move(stacked.target);
    batch.indices = indices;
    return batch;
  }

 private:
  mutable std::mutex mutex_;      // one get_batch at a time inside dataset_
  mutable TorchDataset dataset_;  // mutable: torch's get()/get_batch() are not const
  int64_t size_ = 0;
};

// `dataset` moved (or copied) into an adapter that tandem's BatchLoader takes.
template <typename TorchDataset>
std::shared_ptr<const Dataset> make_dataset(TorchDataset dataset) {
  return std::make_shared<const TorchDatasetAdapter<TorchDataset>>(std::move(dataset));
}

}  // namespace tandem::data
