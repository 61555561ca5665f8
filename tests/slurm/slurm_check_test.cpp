// SLURM for real: `scripts/slurm-check --throwaway-cluster` makes this machine a two-node SLURM cluster
// (scripts/slurm/cluster: Debian's slurm-wlm and munge, state under /tmp) and runs docs/slurm.md's jobs on it:
// srun starting both ranks of `tandem train` on the two nodes, two batch jobs at once, a batch job requeued
// after its first checkpoint that must continue from it and end with an unbroken run's weights, and one
// `tandem run` on each node joining their ranks into one job. The check compares the results itself and names
// what differed; this test runs it under a deadline and checks that each step reported what it proves. Where
// the cluster cannot start (not root, no slurm-wlm, a daemon that fails, neither CI=true nor
// TANDEM_SLURM_TEST=1) the check says why in one line, and the test skips with it.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <string>

#include "support/processes.h"

namespace tandem::testing {
namespace {

// TANDEM_FIXTURE_DIR is <checkout>/tests/fixtures.
std::string checkout_file(const std::string& relative) {
  return (std::filesystem::path(TANDEM_FIXTURE_DIR).parent_path().parent_path() / relative).string();
}

std::string last_line(std::string text) {
  while (!text.empty() && text.back() == '\n') text.pop_back();
  return text.substr(text.rfind('\n') + 1);  // from 0 where there is no newline (npos + 1)
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(Slurm, ThrowawayClusterRunsRanksOnTwoNodesTwoJobsAtOnceARequeuedJobThatContinuesAndALauncherPerNode) {
  // The check ends its steps within 240 s, and its cluster stops itself after 250 s (its daemons' last resort
  // is at 270 s), even if this deadline kills the check first.
  const ProcessResult check = run_process({checkout_file("scripts/slurm-check"), "--throwaway-cluster"},
                                          {{"TANDEM", tandem_cli()}}, std::chrono::seconds(280));
  if (!check.timed_out && check.exit_code == 3) GTEST_SKIP() << last_line(check.output);
  ASSERT_FALSE(check.timed_out) << check.output;
  ASSERT_EQ(check.exit_code, 0) << check.output;

  EXPECT_TRUE(contains(check.output, "ranks ran on 127.0.0.[1-2]:"))
      << "srun -N2 must have put one rank on each node:\n" << check.output;
  EXPECT_TRUE(contains(check.output, "second start: resuming from "))
      << "the requeued job must continue from a checkpoint:\n" << check.output;
  EXPECT_TRUE(contains(check.output, "ended with the unbroken run's weights")) << check.output;
  EXPECT_TRUE(contains(check.output, "nodes 127.0.0.[1-2], world size 4:"))
      << "train.sbatch on two nodes must have joined both nodes' ranks:\n" << check.output;
  EXPECT_TRUE(contains(check.output, "all 4 passed")) << check.output;
}

}  // namespace
}  // namespace tandem::testing
