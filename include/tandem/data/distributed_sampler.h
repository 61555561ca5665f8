#pragma once
// DistributedSampler: splits the indices 0..n-1 of a data set among num_replicas ranks exactly as PyTorch's
// torch.utils.data.distributed.DistributedSampler does, so that a tandem run and a PyTorch run with the same
// seed, epoch, data-set size and world size see the same samples in the same order.
//
// Per epoch: with shuffle, the order is torch::randperm(n) drawn from a CPU generator seeded with seed + epoch
// (the same code path PyTorch's Python sampler uses); without it, 0..n-1. Unless drop_last, the list is padded
// to a multiple of num_replicas by repeating it from its start (cyclically, when the padding is longer than
// the data set); with drop_last its tail is cut instead. Rank r then takes positions r, r + W, r + 2W, ...
//
// Padding lands only at the end of the padded list, so on every rank the padding samples are a suffix of the
// rank's list: positions [real_count(), num_samples()). Evaluation uses this to count every sample once.
#include <cstdint>
#include <vector>

namespace tandem::data {

struct DistributedSamplerOptions {
  int64_t num_replicas = 1;  // world size
  int64_t rank = 0;          // 0 <= rank < num_replicas
  bool shuffle = true;
  uint64_t seed = 0;         // same on every rank; the generator is seeded with seed + epoch
  bool drop_last = false;    // cut the tail instead of padding, when n does not divide by num_replicas
  // Neither pad nor cut: every sample once, ceil(n / W) of them on the first n % W ranks and floor(n / W) on the
  // rest. Collectives per batch then no longer match up by themselves: see ddp/join.h.
  bool uneven = false;
};

class DistributedSampler {
 public:
  // Throws InvalidArgument for a negative dataset_size, num_replicas < 1 or a rank outside [0, num_replicas).
  DistributedSampler(int64_t dataset_size, DistributedSamplerOptions options);

  // Selects the epoch whose order indices() returns (PyTorch's set_epoch). Call it on every rank with the same
  // value before each epoch; without it every epoch repeats the order of epoch 0, as in PyTorch.
  void set_epoch(int64_t epoch);
  int64_t epoch() const { return epoch_; }

  // This rank's indices for the current epoch: num_samples() entries, padding (if any) at the end.
  std::vector<int64_t> indices() const;

  // The whole padded (or cut) list before it is split among ranks: total_size() entries. Rank r's indices()
  // are positions r, r + W, ... of it. Useful to simulate all ranks at once.
  std::vector<int64_t> global_indices() const;

  int64_t dataset_size() const { return dataset_size_; }
  int64_t num_samples() const { return num_samples_; }  // this rank's, padding included (PyTorch's len(sampler))
  // All ranks' samples together: padded or cut to a multiple of num_replicas, or n when uneven.
  int64_t total_size() const { return options_.uneven ? dataset_size_ : num_samples_ * options_.num_replicas; }
  // How many of this rank's num_samples() positions are real samples (the rest repeat earlier ones).
  int64_t real_count() const { return real_count_; }
  int64_t padding_count() const { return num_samples_ - real_count_; }
  // True when position `position` (0 <= position < num_samples()) of indices() is a repeated padding sample.
  bool is_padding(int64_t position) const;

  const DistributedSamplerOptions& options() const { return options_; }

 private:
  int64_t dataset_size_;
  DistributedSamplerOptions options_;
  int64_t num_samples_ = 0;
  int64_t real_count_ = 0;
  int64_t epoch_ = 0;
};

}  // namespace tandem::data
