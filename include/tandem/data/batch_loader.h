#pragma once
// BatchLoader: turns a BatchSampler's index batches into tensor batches from a Dataset, in the sampler's order
// (reproducible for a given seed, epoch and world size), loading the next batches on one background thread
// while the caller trains on the current one.
//
// Usage, on every rank:
//   BatchLoader loader(dataset, BatchSampler(DistributedSampler(dataset->size(), {world, rank, true, seed}), 64));
//   for (int64_t epoch = 0; epoch < epochs; ++epoch) {
//     loader.start_epoch(epoch);
//     while (std::optional<Batch> batch = loader.next()) { ... batch->data, batch->target, batch->padding_count }
//   }
//
// Threading: one consumer thread calls start_epoch/next; the prefetch thread only calls dataset->get_batch.
// At most prefetch_batches loaded batches wait in the queue (bounded memory). An exception thrown while loading
// is rethrown by the next() that would have returned that batch; the epoch then ends. start_epoch and the
// destructor stop an unfinished epoch's thread and join it, so no thread outlives the loader.
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "tandem/data/batch_sampler.h"
#include "tandem/data/dataset.h"

namespace tandem::data {

struct BatchLoaderOptions {
  // Batches loaded ahead on the background thread. 0 loads each batch inside next() on the caller's thread.
  int64_t prefetch_batches = 2;
  // Where next() hands batches over. For a GPU, the prefetch thread copies each batch into pinned (page-locked)
  // host memory and next() starts its copy to the GPU with non_blocking on the caller's current stream, so the
  // copy overlaps the host's work and the kernels queued on that stream wait for it, not the host.
  torch::Device device = torch::kCPU;
};

class BatchLoader {
 public:
  // Throws InvalidArgument for a null dataset, a sampler built for a different data-set size, or a negative
  // prefetch_batches.
  BatchLoader(std::shared_ptr<const Dataset> dataset, BatchSampler sampler, BatchLoaderOptions options = {});
  ~BatchLoader();
  BatchLoader(const BatchLoader&) = delete;
  BatchLoader& operator=(const BatchLoader&) = delete;

  // Sets the sampler's epoch (same values on every rank), drops what is left of a previous epoch and starts
  // loading this epoch's batches. `first_position` > 0 (a run continued inside the epoch, on this world size or
  // another) starts the epoch at that global position of its order: the samples before it are never loaded, and
  // the ones after it are cut into this rank's batches as the sampler shares them out (data/distributed_sampler.h).
  // Throws InvalidArgument for a position outside [0, the data set's size].
  void start_epoch(int64_t epoch, int64_t first_position = 0);

  // The epoch's next batch, or nullopt after the last one. Its padding_count says how many of its final rows
  // repeat earlier samples (DistributedSampler padding). Throws InvalidArgument before the first start_epoch,
  // and rethrows whatever the data set threw while loading this batch.
  std::optional<Batch> next();

  // Of the current epoch from its first position; equal on every rank.
  int64_t num_batches() const { return sampler_.num_batches(); }
  const BatchSampler& sampler() const { return sampler_; }
  const Dataset& dataset() const { return *dataset_; }
  // Seconds next() spent waiting for the prefetch thread (or loading, without prefetch) this epoch: near zero
  // when loading keeps up with training.
  double wait_seconds() const { return wait_seconds_; }

 private:
  struct Item {
    std::optional<Batch> batch;  // empty with a null error: end of epoch
    std::exception_ptr error;
  };

  Batch load(const IndexBatch& index_batch) const;
  Batch on_device(Batch batch) const;
  void produce(std::vector<IndexBatch> batches);
  void stop_worker();

  std::shared_ptr<const Dataset> dataset_;
  BatchSampler sampler_;
  BatchLoaderOptions options_;

  // Consumer-side state (only the consumer thread touches these).
  bool epoch_started_ = false;
  bool epoch_done_ = false;
  std::vector<IndexBatch> sync_batches_;  // prefetch_batches == 0: the epoch's batches, loaded in next()
  size_t sync_position_ = 0;
  double wait_seconds_ = 0.0;

  // Shared with the prefetch thread, guarded by mutex_.
  std::mutex mutex_;
  std::condition_variable queue_changed_;
  std::deque<Item> queue_;
  bool stop_ = false;
  std::thread worker_;
};

}  // namespace tandem::data
