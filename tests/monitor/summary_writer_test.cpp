// SummaryWriter's event files as TensorBoard reads them: the scalars of several tags come back tag for tag,
// step for step, value for value (float32, as TensorBoard stores them), and a resumed run's SessionLog START
// makes TensorBoard show the resumed run's values from that step on. A writer that cannot create its file
// says which.
#include "tandem/monitor/summary_writer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "support/scratch_dir.h"
#include "support/tensorboard_scalars.h"
#include "tandem/util/error.h"

namespace tandem::monitor {
namespace {

using testing::expect_scalars;
using testing::ScalarPoint;

TEST(SummaryWriter, ScalarsOfSeveralTagsReadBackInTensorBoard) {
  testing::ScratchDir dir;
  // Values float32 holds exactly, from the largest to a subnormal, and 0.1, which comes back rounded.
  const std::vector<ScalarPoint> loss = {{0, 2.5}, {1, -1.25}, {2, 0}, {3, 0x1p100}, {4, -0x1p-100}, {5, 0x1p-149}};
  const std::vector<ScalarPoint> lr = {{10, 0.5}, {20, 16777216}, {1000000000000, -3.75}};
  {
    SummaryWriter writer(dir.path());
    for (const ScalarPoint& point : loss) writer.add_scalar("loss", point.value, point.step);
    for (const ScalarPoint& point : lr) writer.add_scalar("step/learning_rate", point.value, point.step, 1.7e9);
    writer.add_scalar("accuracy", 0.1, 7);
    writer.flush();
    EXPECT_EQ(std::filesystem::path(writer.path()).parent_path(), std::filesystem::path(dir.path()));
    EXPECT_EQ(std::filesystem::path(writer.path()).filename().string().rfind("events.out.tfevents.", 0), 0u)
        << writer.path();
  }
  const testing::TensorBoardScalars scalars = testing::read_tensorboard_scalars(dir.path());
  EXPECT_EQ(scalars.size(), 3u);
  expect_scalars(scalars, "loss", loss);
  expect_scalars(scalars, "step/learning_rate", lr);
  expect_scalars(scalars, "accuracy", {{7, static_cast<float>(0.1)}});
}

TEST(SummaryWriter, SessionStartOfAResumedRunReplacesTheKilledRunsStepsFromThere) {
  testing::ScratchDir dir;
  std::string first_path;
  {
    SummaryWriter killed(dir.path());
    first_path = killed.path();
    for (int step = 1; step <= 10; ++step) killed.add_scalar("loss", step, step);
  }
  {
    // The resumed run continues after step 5's checkpoint and trains step 6 again.
    SummaryWriter resumed(dir.path());
    EXPECT_NE(resumed.path(), first_path);
    resumed.add_session_start(6);
    for (int step = 6; step <= 12; ++step) resumed.add_scalar("loss", -100.0 * step, step);
  }
  std::vector<ScalarPoint> expected;
  for (int step = 1; step <= 5; ++step) expected.push_back({step, static_cast<double>(step)});
  for (int step = 6; step <= 12; ++step) expected.push_back({step, -100.0 * step});
  expect_scalars(testing::read_tensorboard_scalars(dir.path()), "loss", expected);
}

TEST(SummaryWriter, LogDirThatCannotBeCreatedThrowsNamingIt) {
  // A path under a regular file cannot be made a directory, even by root (CI runs as root, which ignores
  // permission bits).
  testing::ScratchDir dir;
  std::ofstream(dir / "not_a_dir") << "a file";
  const std::string log_dir = dir / "not_a_dir/run";
  try {
    SummaryWriter writer(log_dir);
    FAIL() << "expected Error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find(log_dir), std::string::npos) << error.what();
  }
}

TEST(SummaryWriter, EventFileThatCannotBeCreatedThrowsNamingIt) {
  // /proc exists, and no one can create a file in it.
  try {
    SummaryWriter writer("/proc");
    FAIL() << "expected Error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("/proc/events.out.tfevents."), std::string::npos) << error.what();
  }
}

}  // namespace
}  // namespace tandem::monitor
