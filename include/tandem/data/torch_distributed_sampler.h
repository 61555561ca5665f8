#pragma once
// TorchDistributedSampler: tandem's DistributedSampler as a sampler for LibTorch's own loader
// (torch::data::make_data_loader), so a program built on torch::data shards its data among ranks in PyTorch's
// order (the order tandem's DistributedSampler reproduces index for index), padding included.
//
// Usage, on every rank:
//   TorchDistributedSampler sampler(DistributedSampler(dataset.size().value(), {world, rank, true, seed}));
//   auto loader = torch::data::make_data_loader(dataset, sampler, torch::data::DataLoaderOptions(64));
//   for (int64_t epoch = 0; epoch < epochs; ++epoch) {
//     sampler.set_epoch(epoch);  // reaches the loader's copy, see below
//     for (auto& batch : *loader) { ... }
//   }
//
// make_data_loader takes the sampler by value and keeps it out of reach, so the object is a handle: copies
// share one state (epoch, order, position), and set_epoch on the copy the caller kept changes the order the
// loader's copy hands out. The loader calls reset() when an iteration begins (begin()), which restarts at the
// first index of the order for the current epoch, as PyTorch's Python sampler computes its order in __iter__.
//
// Threading: not synchronised. The loader calls reset() and next() on the thread that iterates it (its
// workers only load data), so call set_epoch from that thread too, between epochs.
#include <torch/data/samplers/base.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "tandem/data/distributed_sampler.h"
#include "tandem/util/compat.h"

namespace tandem::data {

class TorchDistributedSampler final : public torch::data::samplers::Sampler<std::vector<size_t>> {
 public:
  // Starts at epoch sampler.epoch(), at the first index of that epoch's order.
  explicit TorchDistributedSampler(DistributedSampler sampler);

  // Selects the epoch's order and restarts at its first index (PyTorch's set_epoch): call it on every rank with
  // the same value before each epoch; without it every epoch repeats the order of epoch 0, as in PyTorch. After
  // load(), the loaded epoch restarts at the loaded position instead.
  void set_epoch(int64_t epoch);
  int64_t epoch() const;

  // Restarts at the first index of the current epoch's order, or once at a load()ed position (the loader calls
  // this as its iteration begins). A new_size other than the data set's size
  // re-splits a data set of that size with the same options (world, rank, shuffle, seed, drop_last). The
  // default argument is how torch's loader calls it.
  void reset(compat::TorchDataOptional<size_t> new_size = {}) override;

  // The next up to batch_size indices of this rank's order, or nullopt when the epoch's order is used up.
  // Every rank gets the same number of indices (DistributedSampler padding repeats samples at the end), so
  // every rank takes the same number of steps. Throws InvalidArgument for batch_size 0.
  compat::TorchDataOptional<std::vector<size_t>> next(size_t batch_size) override;

  // The state is the epoch and the position in its order, both equal on every rank at the same step, so the
  // state one rank saved restores every rank; the next iteration of the loader (after set_epoch of the same epoch,
  // if the caller makes one) continues from there. The position counts indices handed out: a loader with
  // workers asks for batches ahead of the ones trained, so save between epochs there, or after the loader has
  // been drained. Size, world, rank, shuffle and seed come from the constructor; load() throws InvalidArgument
  // when the saved position lies past this rank's order.
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

  // How many indices next() has handed out this epoch.
  int64_t position() const;
  const DistributedSampler& sampler() const;

 private:
  struct State {
    DistributedSampler sampler;
    std::vector<int64_t> order;  // sampler.indices() as of the last restart
    size_t position = 0;
    size_t loaded_position = 0;  // where the loaded epoch restarts, until the loader's next reset()
  };

  void restart();

  std::shared_ptr<State> state_;
};

}  // namespace tandem::data
