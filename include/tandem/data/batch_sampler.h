#pragma once
// BatchSampler: groups one rank's DistributedSampler indices into consecutive batches, as PyTorch's
// torch.utils.data.BatchSampler(sampler, batch_size, drop_last) does, and says how many samples of each batch
// are padding repeats so that evaluation can count every real sample once.
#include <cstdint>
#include <vector>

#include "tandem/data/distributed_sampler.h"

namespace tandem::data {

// One batch of data-set indices for one rank. Padding samples are always the last `padding_count` entries
// (the sampler puts padding at the end of a rank's list), so `indices[0 .. real_count())` are real samples.
struct IndexBatch {
  std::vector<int64_t> indices;
  int64_t padding_count = 0;

  int64_t size() const { return static_cast<int64_t>(indices.size()); }
  int64_t real_count() const { return size() - padding_count; }
};

// A final batch of a single sample, where drop_last keeps partial batches. BatchNorm cannot train on one sample
// ("expected more than 1 value per channel" once the spatial size is 1x1), and under uneven inputs that rank
// alone would fail while the others wait for it: kMergeIntoPrevious makes that sample part of the batch before
// it, which is then one sample larger, so every sample is still trained on once.
enum class SingleSampleTail { kKeep, kMergeIntoPrevious };

class BatchSampler {
 public:
  // drop_last drops a final batch smaller than batch_size (PyTorch's BatchSampler drop_last; independent of the
  // DistributedSampler's own drop_last). Throws InvalidArgument for batch_size < 1.
  BatchSampler(DistributedSampler sampler, int64_t batch_size, bool drop_last = false,
               SingleSampleTail single_sample_tail = SingleSampleTail::kKeep);

  // Forwards to the sampler: call with the same epoch (and first position) on every rank before each epoch. The
  // epoch's batches then cut this rank's share of the positions from first_position on.
  void set_epoch(int64_t epoch, int64_t first_position = 0) { sampler_.set_epoch(epoch, first_position); }
  int64_t epoch() const { return sampler_.epoch(); }

  // This rank's batches for the current epoch, in order.
  std::vector<IndexBatch> batches() const;
  // Of the current epoch (from its first position). Equal on every rank (every rank has the same num_samples),
  // so collectives per batch stay matched; an uneven sampler breaks that on purpose (ddp/join.h).
  int64_t num_batches() const;

  int64_t batch_size() const { return batch_size_; }
  bool drop_last() const { return drop_last_; }
  const DistributedSampler& sampler() const { return sampler_; }

 private:
  DistributedSampler sampler_;
  int64_t batch_size_;
  bool drop_last_;
  SingleSampleTail single_sample_tail_;
};

}  // namespace tandem::data
