#pragma once
// The seeds' learning-rate schedule (Bag of Tricks, arXiv:1812.01187): a cosine per epoch from lr down to
// lr * lrf, applied as PyTorch's LambdaLR with
//   lf(epoch) = ((1 + cos(epoch * pi / epochs)) / 2) * (1 - lrf) + lrf
// Epoch e (0-based) trains with base_lr * lf(e). The schedule is a pure function of the epoch, so a
// checkpoint needs to store only the epoch to restore it.
#include <cmath>

namespace tandem::train {

class CosineSchedule {
 public:
  // base_lr is the already world-size-scaled rate; epochs > 0.
  CosineSchedule(double base_lr, double lrf, int epochs) : base_lr_(base_lr), lrf_(lrf), epochs_(epochs) {}

  double factor(int epoch) const {
    constexpr double kPi = 3.14159265358979323846;
    return ((1.0 + std::cos(epoch * kPi / epochs_)) / 2.0) * (1.0 - lrf_) + lrf_;
  }
  double lr(int epoch) const { return base_lr_ * factor(epoch); }

  double base_lr() const { return base_lr_; }
  double lrf() const { return lrf_; }
  int epochs() const { return epochs_; }

 private:
  double base_lr_;
  double lrf_;
  int epochs_;
};

}  // namespace tandem::train
