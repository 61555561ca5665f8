// RunRecorder's TensorBoard scalars agree with its metrics.jsonl and steps.jsonl across a resume, as TensorBoard
// itself reads them (issue 27, #11): a --steps stop inside an epoch writes that epoch's line early, which the
// continued run drops from metrics.jsonl and must drop from TensorBoard too; a resume at an epoch's end keeps
// that epoch and its last step in both.
#include "tandem/train/run_recorder.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "support/scratch_dir.h"
#include "support/tensorboard_scalars.h"

namespace tandem::train {
namespace {


constexpr int64_t kRecordedStepsPerEpoch = 5;

using testing::read_json_lines;

// Records steps first..last of a run whose attempt is `attempt` (its values differ from every other
// attempt's), and the epoch lines of the epochs those steps end; with `stop_early`, also the line of the
// unfinished epoch at `last`, as a --steps stop writes it.
void record(RunRecorder& recorder, int attempt, int64_t first, int64_t last, bool stop_early) {
  for (int64_t step = first; step <= last; ++step) {
    const int epoch = static_cast<int>((step - 1) / kRecordedStepsPerEpoch);
    StepMetrics m;
    m.step = step;
    m.epoch = epoch;
    m.batch = (step - 1) % kRecordedStepsPerEpoch;
    m.loss = attempt * 100 + step;
    m.lr = 0.1 * attempt;
    recorder.record_step(m);
    if (step % kRecordedStepsPerEpoch == 0 || (stop_early && step == last)) {
      EpochMetrics e;
      e.epoch = epoch;
      e.loss = attempt * 1000 + step;
      e.accuracy = 0.01 * (attempt + step);
      e.correct = 1;
      e.total = 10;
      e.lr = 0.1 * attempt;
      e.samples_per_second = attempt * 10 + step;
      e.step = step;
      recorder.record_epoch(e);
    }
  }
}

TEST(RunRecorderTensorBoard, AResumeAfterAStepsStopInsideAnEpochForgetsThatEpochsEarlyLine) {
  testing::ScratchDir dir;
  const RunRecorderOptions options{/*tensorboard=*/true, /*has_eval_set=*/true};
  {
    RunRecorder stopped(dir.path(), 0, 0, options);
    record(stopped, 1, 1, 7, /*stop_early=*/true);  // --steps 7: epoch 1's line at step 7
  }
  {
    RunRecorder resumed(dir.path(), 1, 7, options);  // the checkpoint at epoch 1, batch 2, step 7
    record(resumed, 2, 8, 10, false);
  }
  ASSERT_EQ(read_json_lines(dir / "metrics.jsonl").size(), 2u);
  testing::expect_tensorboard_matches_records(dir.path());
}

TEST(RunRecorderTensorBoard, AResumeAtAnEpochsEndKeepsThatEpochAndItsLastStep) {
  testing::ScratchDir dir;
  const RunRecorderOptions options{true, true};
  {
    RunRecorder killed(dir.path(), 0, 0, options);
    record(killed, 1, 1, 8, false);  // killed after step 8, its checkpoint after epoch 0 (step 5)
  }
  {
    RunRecorder resumed(dir.path(), 1, 5, options);
    record(resumed, 2, 6, 10, false);
  }
  ASSERT_EQ(read_json_lines(dir / "steps.jsonl").size(), 10u);
  testing::expect_tensorboard_matches_records(dir.path());
}

}  // namespace
}  // namespace tandem::train
