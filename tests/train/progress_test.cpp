// The progress bar's total when the run stops inside an epoch (max_steps): it counts to the stop, so that its
// ETA is the time to the stop, where it counted to the epoch's end and promised steps the run never takes.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "tandem/train/progress.h"

namespace tandem::train::progress_total {
namespace {

// What a bar of `batches_per_epoch` drew (forced into terminal mode, into a temporary file) after `start` and
// updates for every batch from `first_batch` to `last_batch`.
template <typename Start>
std::string drawn(int64_t batches_per_epoch, int64_t first_batch, int64_t last_batch, Start&& start) {
  std::FILE* out = std::tmpfile();
  EXPECT_NE(out, nullptr);
  ProgressOptions options;
  options.out = out;
  options.terminal = 1;
  {
    ProgressReporter reporter(batches_per_epoch, 8, options);
    start(reporter);
    for (int64_t batch = first_batch; batch <= last_batch; ++batch) reporter.update(batch, 0.5);
    reporter.end_epoch();
  }
  std::rewind(out);
  std::string text;
  for (int c = std::fgetc(out); c != EOF; c = std::fgetc(out)) text += static_cast<char>(c);
  std::fclose(out);
  return text;
}

TEST(ProgressTotal, AStopInsideTheEpochIsTheBarsTotal) {
  const std::string text = drawn(10, 0, 2, [](ProgressReporter& r) { r.start_epoch(0, 0, 3); });
  EXPECT_NE(text.find("[########################] 3/3 "), std::string::npos) << text;
  EXPECT_NE(text.find("ETA 00:00"), std::string::npos) << text;
  EXPECT_EQ(text.find("/10 "), std::string::npos) << text;
}

TEST(ProgressTotal, AfterAResumeTheStopCountsFromTheFirstBatch) {
  const std::string text = drawn(10, 4, 6, [](ProgressReporter& r) { r.start_epoch(1, 4, 3); });
  EXPECT_NE(text.find("[epoch 1] [########################] 7/7 "), std::string::npos) << text;
}

TEST(ProgressTotal, AStopPastTheEpochsEndLeavesTheWholeEpoch) {
  const std::string text = drawn(10, 0, 9, [](ProgressReporter& r) { r.start_epoch(0, 0, 25); });
  EXPECT_NE(text.find("[########################] 10/10 "), std::string::npos) << text;
  const std::string unlimited = drawn(10, 0, 9, [](ProgressReporter& r) { r.start_epoch(0); });
  EXPECT_NE(unlimited.find("[########################] 10/10 "), std::string::npos) << unlimited;
}

}  // namespace
}  // namespace tandem::train::progress_total
