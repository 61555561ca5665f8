// The short version of the kill trials (scripts/kill-trials, RELIABILITY.md): three 2-rank jobs under
// `tandem run --max-restarts`, each with one rank killed by SIGKILL, end with weights byte-identical to an
// uninterrupted run's.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "support/processes.h"

namespace tandem::testing {
namespace {

TEST(KillTrials, ThreeTrialsEndWithTheUninterruptedWeights) {
  if (!std::filesystem::exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz")) {
    GTEST_SKIP() << "needs Debian's dataset-fashion-mnist";
  }
  const std::filesystem::path script = std::filesystem::path(TANDEM_FIXTURE_DIR) / "../../scripts/kill-trials";
  const std::string build_dir = std::filesystem::path(tandem_cli()).parent_path().string();
  // Seed 8 draws a kill during a checkpoint write, and a kill of each rank at a step.
  ProcessResult result = run_process({"bash", script.string(), "--trials", "3", "--seed", "8", "--build", build_dir},
                                     {}, std::chrono::seconds(280));
  std::printf("%s", result.output.c_str());
  EXPECT_FALSE(result.timed_out);
  EXPECT_EQ(result.exit_code, 0);
  EXPECT_NE(result.output.find("trials run: 3, identical: 3, different: 0, lost: 0"), std::string::npos);
}

}  // namespace
}  // namespace tandem::testing
