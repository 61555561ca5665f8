#pragma once
// The seeds' learning-rate schedule (Bag of Tricks, arXiv:1812.01187): a cosine per epoch from lr down to
// lr * lrf, applied as PyTorch's LambdaLR with
//   lf(epoch) = ((1 + cos(epoch * pi / epochs)) / 2) * (1 - lrf) + lrf
// Epoch e (0-based) trains with base_lr * lf(e). An optional linear warmup (Goyal et al., arXiv:1706.02677, for
// the large batches of many ranks) scales the first warmup_steps optimizer steps by (step + 1) / warmup_steps.
// The schedule is a pure function of (epoch, step), so a checkpoint restores it from those two numbers. A run
// continued on another world size or batch size (docs/checkpoint.md) keeps both: the cosine stays at its epoch,
// and warmup counts optimizer steps whatever their size, so it ends at the same step, of the new global batch.
// The base the factors multiply follows the global batch (train/loop_options.h).
#include <algorithm>
#include <cmath>
#include <cstdint>

namespace tandem::train {

class CosineSchedule {
 public:
  // base_lr is the already scaled rate (by the global batch); epochs > 0; warmup_steps >= 0 (0: none).
  CosineSchedule(double base_lr, double lrf, int epochs, int64_t warmup_steps = 0)
      : base_lr_(base_lr), lrf_(lrf), epochs_(epochs), warmup_steps_(warmup_steps) {}

  double factor(int epoch) const {
    constexpr double kPi = 3.14159265358979323846;
    return ((1.0 + std::cos(epoch * kPi / epochs_)) / 2.0) * (1.0 - lrf_) + lrf_;
  }
  // Of the optimizer step `step`, 0-based and counted from the start of the run.
  double warmup_factor(int64_t step) const {
    return step < warmup_steps_ ? static_cast<double>(step + 1) / static_cast<double>(warmup_steps_) : 1.0;
  }
  double lr(int epoch) const { return base_lr_ * factor(epoch); }

  double base_lr() const { return base_lr_; }
  double lrf() const { return lrf_; }
  int epochs() const { return epochs_; }

 private:
  double base_lr_;
  double lrf_;
  int epochs_;
  int64_t warmup_steps_;
};

}  // namespace tandem::train
