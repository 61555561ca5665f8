#include "tandem/data/batch_loader.h"

#include <algorithm>
#include <chrono>

#include "tandem/util/error.h"

namespace tandem::data {

BatchLoader::BatchLoader(std::shared_ptr<const Dataset> dataset, BatchSampler sampler, BatchLoaderOptions options)
    : dataset_(std::move(dataset)), sampler_(std::move(sampler)), options_(options) {
  if (!dataset_) throw InvalidArgument("BatchLoader: dataset is null");
  if (sampler_.sampler().dataset_size() != dataset_->size()) {
    throw InvalidArgument(detail::concat("BatchLoader: the sampler was built for ", sampler_.sampler().dataset_size(),
                                         " samples but the data set has ", dataset_->size()));
  }
  if (options_.prefetch_batches < 0) {
    throw InvalidArgument(detail::concat("BatchLoader: prefetch_batches must be >= 0, got ", options_.prefetch_batches));
  }
}

BatchLoader::~BatchLoader() { stop_worker(); }

void BatchLoader::stop_worker() {
  if (!worker_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  queue_changed_.notify_all();
  worker_.join();
  std::lock_guard<std::mutex> lock(mutex_);
  queue_.clear();
  stop_ = false;
}

Batch BatchLoader::load(const IndexBatch& index_batch) const {
  Batch batch = dataset_->get_batch(index_batch.indices);
  if (options_.device.is_cuda()) {
    batch.data = batch.data.pin_memory();
    batch.target = batch.target.pin_memory();
  }
  const std::vector<int64_t>& requested = index_batch.indices;
  if (batch.indices.size() == requested.size()) {
    batch.padding_count = index_batch.padding_count;
    return batch;
  }
  // The data set dropped rows (unreadable images): the kept rows are the requested ones in order, so match
  // them against the request and count as padding only the kept rows from the padded tail. A dropped real row
  // then leaves the real count one smaller, and a dropped padding row leaves it unchanged.
  const size_t first_padding = requested.size() - static_cast<size_t>(index_batch.padding_count);
  size_t position = 0;
  batch.padding_count = 0;
  for (int64_t index : batch.indices) {
    while (position < requested.size() && requested[position] != index) ++position;
    TANDEM_CHECK(position < requested.size(), "data set returned index ", index, " that the batch did not request");
    if (position >= first_padding) ++batch.padding_count;
    ++position;
  }
  return batch;
}

void BatchLoader::start_epoch(int64_t epoch, int64_t first_position) {
  stop_worker();
  sampler_.set_epoch(epoch, first_position);
  epoch_started_ = true;
  epoch_done_ = false;
  wait_seconds_ = 0.0;
  std::vector<IndexBatch> batches = sampler_.batches();
  if (options_.prefetch_batches == 0) {
    sync_batches_ = std::move(batches);
    sync_position_ = 0;
    return;
  }
  worker_ = std::thread([this, batches = std::move(batches)]() mutable { produce(std::move(batches)); });
}

void BatchLoader::produce(std::vector<IndexBatch> batches) {
  // Waits for room in the queue (or a stop request); returns false when asked to stop.
  auto push = [this](Item item) {
    std::unique_lock<std::mutex> lock(mutex_);
    queue_changed_.wait(lock, [this] {
      return stop_ || static_cast<int64_t>(queue_.size()) < options_.prefetch_batches;
    });
    if (stop_) return false;
    queue_.push_back(std::move(item));
    lock.unlock();
    queue_changed_.notify_all();
    return true;
  };
  for (const IndexBatch& index_batch : batches) {
    Item item;
    try {
      item.batch = load(index_batch);
    } catch (...) {
      item.error = std::current_exception();
    }
    const bool failed = item.error != nullptr;
    if (!push(std::move(item)) || failed) return;
  }
  push(Item{});  // end of epoch
}

std::optional<Batch> BatchLoader::next() {
  if (!epoch_started_) throw InvalidArgument("BatchLoader::next() called before start_epoch()");
  if (epoch_done_) return std::nullopt;
  const auto started = std::chrono::steady_clock::now();
  auto record_wait = [&] {
    wait_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  };

  if (options_.prefetch_batches == 0) {
    if (sync_position_ == sync_batches_.size()) {
      epoch_done_ = true;
      return std::nullopt;
    }
    const IndexBatch& index_batch = sync_batches_[sync_position_++];
    try {
      Batch batch = load(index_batch);
      record_wait();
      return on_device(std::move(batch));
    } catch (...) {
      epoch_done_ = true;
      throw;
    }
  }

  Item item;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    queue_changed_.wait(lock, [this] { return !queue_.empty(); });
    item = std::move(queue_.front());
    queue_.pop_front();
  }
  queue_changed_.notify_all();
  record_wait();
  if (item.error) {
    epoch_done_ = true;
    stop_worker();
    std::rethrow_exception(item.error);
  }
  if (!item.batch) {
    epoch_done_ = true;
    stop_worker();
    return std::nullopt;
  }
  return on_device(std::move(*item.batch));
}

Batch BatchLoader::on_device(Batch batch) const {
  if (options_.device.is_cpu()) return batch;
  // The pinned source stays alive until the copy is done: LibTorch's pinned-memory allocator records the copy
  // on its stream and reuses the block only after it.
  batch.data = batch.data.to(options_.device, /*non_blocking=*/true);
  batch.target = batch.target.to(options_.device, /*non_blocking=*/true);
  return batch;
}

}  // namespace tandem::data
