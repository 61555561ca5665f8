#include "tandem/data/batch_sampler.h"

#include <algorithm>

#include "tandem/util/error.h"

namespace tandem::data {

BatchSampler::BatchSampler(DistributedSampler sampler, int64_t batch_size, bool drop_last,
                           SingleSampleTail single_sample_tail)
    : sampler_(std::move(sampler)), batch_size_(batch_size), drop_last_(drop_last),
      single_sample_tail_(single_sample_tail) {
  if (batch_size < 1) {
    throw InvalidArgument(detail::concat("BatchSampler: batch size must be >= 1, got ", batch_size));
  }
}

int64_t BatchSampler::num_batches() const {
  const int64_t samples = sampler_.num_samples();
  if (drop_last_) return samples / batch_size_;
  const bool merge_tail = single_sample_tail_ == SingleSampleTail::kMergeIntoPrevious && batch_size_ > 1 &&
                          samples > batch_size_ && samples % batch_size_ == 1;
  return (samples + batch_size_ - 1) / batch_size_ - (merge_tail ? 1 : 0);
}

std::vector<IndexBatch> BatchSampler::batches() const {
  const std::vector<int64_t> indices = sampler_.indices();
  const int64_t real = sampler_.real_count();
  const int64_t count = num_batches();
  std::vector<IndexBatch> out(static_cast<size_t>(count));
  for (int64_t b = 0; b < count; ++b) {
    const int64_t begin = b * batch_size_;
    // The last batch runs to the end: a merged single-sample tail makes it one longer than batch_size.
    const auto available = static_cast<int64_t>(indices.size());
    const int64_t end = b + 1 == count && !drop_last_ ? available : std::min<int64_t>(begin + batch_size_, available);
    IndexBatch& batch = out[static_cast<size_t>(b)];
    batch.indices.assign(indices.begin() + begin, indices.begin() + end);
    // Positions >= real are padding; they form the suffix of the rank's list.
    batch.padding_count = end - std::clamp<int64_t>(real, begin, end);
  }
  return out;
}

}  // namespace tandem::data
