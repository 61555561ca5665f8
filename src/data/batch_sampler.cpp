#include "tandem/data/batch_sampler.h"

#include <algorithm>

#include "tandem/util/error.h"

namespace tandem::data {

BatchSampler::BatchSampler(DistributedSampler sampler, int64_t batch_size, bool drop_last)
    : sampler_(std::move(sampler)), batch_size_(batch_size), drop_last_(drop_last) {
  if (batch_size < 1) {
    throw InvalidArgument(detail::concat("BatchSampler: batch size must be >= 1, got ", batch_size));
  }
}

int64_t BatchSampler::num_batches() const {
  const int64_t samples = sampler_.num_samples();
  return drop_last_ ? samples / batch_size_ : (samples + batch_size_ - 1) / batch_size_;
}

std::vector<IndexBatch> BatchSampler::batches() const {
  const std::vector<int64_t> indices = sampler_.indices();
  const int64_t real = sampler_.real_count();
  const int64_t count = num_batches();
  std::vector<IndexBatch> out(static_cast<size_t>(count));
  for (int64_t b = 0; b < count; ++b) {
    const int64_t begin = b * batch_size_;
    const int64_t end = std::min<int64_t>(begin + batch_size_, static_cast<int64_t>(indices.size()));
    IndexBatch& batch = out[static_cast<size_t>(b)];
    batch.indices.assign(indices.begin() + begin, indices.begin() + end);
    // Positions >= real are padding; they form the suffix of the rank's list.
    batch.padding_count = end - std::clamp<int64_t>(real, begin, end);
  }
  return out;
}

}  // namespace tandem::data
