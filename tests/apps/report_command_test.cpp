// `tandem report` through the built binary: a wrong run dir is one line and exit code 2, a good one writes the
// page where it says and prints its path. What the page holds is tests/monitor/report_test.cpp's business.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "support/processes.h"
#include "support/scratch_dir.h"
#include "tandem/config.h"

namespace tandem::app {
namespace {

testing::ProcessResult run_report(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {testing::tandem_cli(), "report"};
  argv.insert(argv.end(), args.begin(), args.end());
  return testing::run_process(argv, {}, std::chrono::seconds(30));
}

void expect_one_line_error(const testing::ProcessResult& result, const std::string& expected) {
  ASSERT_FALSE(result.timed_out) << result.output;
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find(expected), std::string::npos) << result.output;
  EXPECT_EQ(std::count(result.output.begin(), result.output.end(), '\n'), 1) << result.output;
}

TEST(ReportCommand, MissingRunDirIsOneLine) {
  testing::ScratchDir scratch;
  expect_one_line_error(run_report({scratch / "absent"}), "run directory " + (scratch / "absent") + " not found");
  expect_one_line_error(run_report({scratch.path()}), scratch / "metrics.jsonl not found");
  expect_one_line_error(run_report({}), "RUN_DIR is required");
}

TEST(ReportCommand, WritesThePageAndPrintsItsPath) {
  if (!TANDEM_HAVE_DYGRAPHS) GTEST_SKIP() << "built without libjs-dygraphs";
  testing::ScratchDir scratch;
  std::ofstream(scratch / "metrics.jsonl")
      << R"({"epoch":0,"loss":0.61,"accuracy":0.853,"correct":8530,"total":10000,"lr":0.02,)"
      << R"("samples_per_second":9100,"train_seconds":6.5,"step":937})" << "\n";

  testing::ProcessResult result = run_report({scratch.path()});
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_EQ(result.output, scratch / "report.html\n");
  EXPECT_TRUE(std::filesystem::is_regular_file(scratch / "report.html"));

  result = run_report({scratch.path(), "--output", scratch / "elsewhere.html"});
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_EQ(result.output, scratch / "elsewhere.html\n");
  EXPECT_GT(std::filesystem::file_size(scratch / "elsewhere.html"), 100000u) << "dygraphs is not inlined";
}

TEST(ReportCommand, HelpSaysWhatThePageHolds) {
  const testing::ProcessResult result = run_report({"--help"});
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("RUN_DIR/report.html"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("opens offline"), std::string::npos) << result.output;
}

}  // namespace
}  // namespace tandem::app
