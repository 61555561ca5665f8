// The backbone: N ranks with DistributedDataParallel on batch b each train exactly like one process on the
// concatenated N*b batch (20 SGD steps with momentum and weight decay), in every configuration DDP offers.
#include <gtest/gtest.h>

#include <array>
#include <mutex>

#include "ddp_fixtures.h"
#include "support/thread_ranks.h"

namespace tandem::testing {
namespace {

constexpr double kRelativeTolerance = 1e-5;

void expect_parity(const Scenario& s, const char* label, double tolerance = kRelativeTolerance) {
  const auto expected = train_reference(s);
  std::mutex mutex;
  Difference worst;
  run_thread_ranks(s.world, [&](int rank, comm::Communicator& communicator) {
    const auto got = train_ddp(s, rank, borrow(communicator));
    const Difference d = compare(got, expected);
    std::lock_guard<std::mutex> lock(mutex);
    worst.max_abs = std::max(worst.max_abs, d.max_abs);
    worst.max_rel = std::max(worst.max_rel, d.max_rel);
  });
  std::printf("[parity] %-34s world %d: largest difference abs %.3g, relative %.3g\n", label, s.world, worst.max_abs,
              worst.max_rel);
  EXPECT_LE(worst.max_rel, tolerance) << label;
}

class DdpParity : public ::testing::TestWithParam<int> {};

TEST_P(DdpParity, PlainBuckets) {
  Scenario s;
  s.world = GetParam();
  expect_parity(s, "one bucket");
}

TEST_P(DdpParity, NoSyncAccumulationOverFourMicroBatches) {
  Scenario s;
  s.world = GetParam();
  s.micro_batches = 4;
  expect_parity(s, "no_sync x4");
}

TEST_P(DdpParity, FrozenLayerIsLeftOut) {
  Scenario s;
  s.world = GetParam();
  s.frozen_fc1 = true;
  expect_parity(s, "frozen fc1");
}

TEST_P(DdpParity, UnusedParameterWithFindUnused) {
  Scenario s;
  s.world = GetParam();
  s.with_extra = true;
  s.options.find_unused_parameters = true;
  expect_parity(s, "unused layer + find_unused");
}

TEST_P(DdpParity, ManySmallBuckets) {
  Scenario s;
  s.world = GetParam();
  s.options.bucket_cap_mb = 300.0 / (1024 * 1024);  // ~300 bytes: several parameters get their own bucket
  s.options.first_bucket_cap_mb = 100.0 / (1024 * 1024);
  expect_parity(s, "tiny buckets");
}

TEST_P(DdpParity, GradientAsBucketViewWithNoSyncAndBuckets) {
  Scenario s;
  s.world = GetParam();
  s.micro_batches = 4;
  s.options.gradient_as_bucket_view = true;
  s.options.bucket_cap_mb = 300.0 / (1024 * 1024);
  s.options.first_bucket_cap_mb = 100.0 / (1024 * 1024);
  expect_parity(s, "bucket view + no_sync + buckets");
}

TEST_P(DdpParity, NoSyncWithUnusedAndBucketView) {
  Scenario s;
  s.world = GetParam();
  s.micro_batches = 4;
  s.with_extra = true;
  s.options.find_unused_parameters = true;
  s.options.gradient_as_bucket_view = true;
  expect_parity(s, "no_sync + unused + bucket view");
}

TEST_P(DdpParity, Fp16CompressionIsClose) {
  Scenario s;
  s.world = GetParam();
  s.options.comm_hook = ddp::make_fp16_compress_hook();
  expect_parity(s, "fp16 compression hook", /*tolerance=*/5e-3);
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, DdpParity, ::testing::Values(2, 3));

TEST(DdpParity, WorldOfOneIsPlainTraining) {
  Scenario s;
  s.world = 1;
  const auto expected = train_reference(s);
  const Difference d = compare(train_ddp(s, 0, nullptr), expected);
  std::printf("[parity] world of one (no communicator): largest difference abs %.3g\n", d.max_abs);
  EXPECT_EQ(d.max_abs, 0.0);
}

}  // namespace
}  // namespace tandem::testing
