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
//
// An epoch may start at a global position P of the order (a run continued inside an epoch, perhaps on another
// world size: train/loop.h). The epoch then covers only positions [P, n): those are padded (or cut) to a
// multiple of num_replicas and rank r takes P + r, P + r + W, ... The padding repeats the order cyclically from
// its start, as PyTorch's does; with P = 0 this is PyTorch's epoch, and with P a multiple of W it is exactly the
// ordinary epoch's list with its first P positions taken away, so a run continued on the world size that stopped
// it trains what the uninterrupted one would have.
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

  // Selects the epoch whose order indices() returns (PyTorch's set_epoch), and the global position of its order
  // it starts at (0 <= first_position <= n; InvalidArgument otherwise). Call it on every rank with the same values
  // before each epoch; without it every epoch repeats the order of epoch 0, as in PyTorch.
  void set_epoch(int64_t epoch, int64_t first_position = 0);
  int64_t epoch() const { return epoch_; }
  int64_t first_position() const { return first_position_; }

  // This rank's indices for the current epoch: num_samples() entries, padding (if any) at the end.
  std::vector<int64_t> indices() const;

  // The whole padded (or cut) list of the epoch's positions [first_position(), ...) before it is split among
  // ranks: total_size() entries. Rank r's indices() are entries r, r + W, ... of it. Useful to simulate all ranks
  // at once.
  std::vector<int64_t> global_indices() const;

  int64_t dataset_size() const { return dataset_size_; }
  int64_t num_samples() const { return num_samples_; }  // this rank's, padding included (PyTorch's len(sampler))
  // All ranks' samples together: the positions from first_position() on, padded or cut to a multiple of
  // num_replicas, or all of them when uneven.
  int64_t total_size() const {
    return options_.uneven ? dataset_size_ - first_position_ : num_samples_ * options_.num_replicas;
  }
  // How many of this rank's num_samples() positions are real samples (the rest repeat earlier ones).
  int64_t real_count() const { return real_count_; }
  int64_t padding_count() const { return num_samples_ - real_count_; }
  // True when position `position` (0 <= position < num_samples()) of indices() is a repeated padding sample.
  bool is_padding(int64_t position) const;

  const DistributedSamplerOptions& options() const { return options_; }

 private:
  // num_samples_ and real_count_ of the epoch's positions [first_position_, n).
  void count_samples();

  int64_t dataset_size_;
  DistributedSamplerOptions options_;
  int64_t num_samples_ = 0;
  int64_t real_count_ = 0;
  int64_t epoch_ = 0;
  int64_t first_position_ = 0;
};

}  // namespace tandem::data
