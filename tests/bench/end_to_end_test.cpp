// `tandem bench train --end-to-end`: the throughput between a short and a long run, and the commands it times.
#include <gtest/gtest.h>

#include <string>

#include "bench/train/end_to_end.h"
#include "tandem/util/error.h"

namespace tandem::bench::end_to_end_test {
namespace {

TEST(EndToEndThroughput, IsTheStepsBetweenTheRunsOverTheirDifferenceInTime) {
  // 200 steps of 128 samples in the 6.4 s that the long run took beyond the short one.
  EXPECT_DOUBLE_EQ(samples_per_second_between(40, 4.0, 240, 10.4, 128), 4000.0);
  // Start-up and loading are in both runs, so they do not move the figure.
  EXPECT_DOUBLE_EQ(samples_per_second_between(40, 9.0, 240, 15.4, 128), 4000.0);
}

TEST(EndToEndThroughput, ALongRunThatWasNotLongerIsAnError) {
  EXPECT_THROW(samples_per_second_between(40, 5.0, 240, 5.0, 128), CommError);
  EXPECT_THROW(samples_per_second_between(40, 6.0, 240, 5.0, 128), CommError);
}

TEST(EndToEndCommands, TandemRunsTheMainJobWithEveryDefaultOfTrain) {
  EndToEndOptions options;
  options.program = "/opt/tandem";
  const std::string command = tandem_main_job_command(options, 240, "/tmp/run dir");
  EXPECT_EQ(command,
            "'/opt/tandem' run --nproc-per-node 2 -- '/opt/tandem' train --steps 240 --batch-size 64 --threads 1 "
            "--run-dir '/tmp/run dir'");
  // Nothing that turns a default off: TensorBoard, the report, the replica check and progress stay on.
  EXPECT_EQ(command.find("--no-"), std::string::npos);
}

TEST(EndToEndCommands, PytorchRunsTheSameShapeOfJob) {
  EndToEndOptions options;
  options.nproc = 3;
  options.batch_size = 32;
  EXPECT_EQ(pytorch_end_to_end_command(options, "'/usr/bin/python3'", 40),
            "'/usr/bin/python3' 'bench/train/pytorch_end_to_end.py' --nproc 3 --steps 40 --batch-size 32 --threads 1");
}

}  // namespace
}  // namespace tandem::bench::end_to_end_test
