// The learning-rate schedule against the seed program's lambda.
#include <gtest/gtest.h>

#include <cmath>

#include "tandem/train/lr_schedule.h"

namespace tandem::train {
namespace {

TEST(CosineSchedule, MatchesTheSeedsLambda) {
  const int epochs = 10;
  const double lrf = 0.1;
  CosineSchedule schedule(0.02, lrf, epochs);
  for (int epoch = 0; epoch <= epochs; ++epoch) {
    const double seed_lambda = ((1 + std::cos(epoch * M_PI / epochs)) / 2) * (1 - lrf) + lrf;
    EXPECT_DOUBLE_EQ(schedule.lr(epoch), 0.02 * seed_lambda) << "epoch " << epoch;
  }
  EXPECT_DOUBLE_EQ(schedule.lr(0), 0.02);
  EXPECT_NEAR(schedule.lr(epochs), 0.02 * lrf, 1e-15);
}

}  // namespace
}  // namespace tandem::train
