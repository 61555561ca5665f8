// The `tandem` program's numeric flags (apps/flag_checks.h), through the built binary: a value out of range is
// one short line naming the flag, the value and what the flag accepts, where CLI11's own checks printed
// "Value -3 not in range 0.000000 to 1797693134862315708...000000" with all 300 digits of the double's limit.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "support/processes.h"

namespace tandem::app {
namespace {

testing::ProcessResult run_tandem(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {testing::tandem_cli()};
  argv.insert(argv.end(), args.begin(), args.end());
  return testing::run_process(argv, {}, std::chrono::seconds(30));
}

// Expects `tandem ARGS` to exit 2 (a wrong command line) with exactly one short line holding `expected`.
void expect_refused(const std::vector<std::string>& args, const std::string& expected) {
  const testing::ProcessResult result = run_tandem(args);
  ASSERT_FALSE(result.timed_out) << result.output;
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find(expected), std::string::npos) << result.output;
  EXPECT_EQ(std::count(result.output.begin(), result.output.end(), '\n'), 1) << result.output;
  EXPECT_LT(result.output.size(), 200u) << result.output;
}

TEST(FlagChecks, WholeNumberBelowItsMinimumIsOneShortLine) {
  expect_refused({"train", "--epochs", "-3"}, "tandem: error: --epochs: must be at least 1, not -3 (see --help)");
  expect_refused({"train", "--batch-size", "0"}, "--batch-size: must be at least 1, not 0");
  expect_refused({"train", "--keep-checkpoints", "-1"}, "--keep-checkpoints: must be at least 0, not -1");
  expect_refused({"bench", "train", "--rounds", "0"}, "--rounds: must be at least 1, not 0");
  expect_refused({"bench", "train", "--powersgd-start", "1"}, "--powersgd-start: must be at least 2, not 1");
}

TEST(FlagChecks, RealNumberOutsideItsRangeIsOneShortLine) {
  expect_refused({"train", "--val-split", "1.5"},
                 "tandem: error: --val-split: must be between 0 and 0.99, not 1.5 (see --help)");
  expect_refused({"train", "--min-crop-scale", "0"}, "--min-crop-scale: must be between 0.01 and 1, not 0");
  expect_refused({"train", "--lr", "0"}, "--lr: must be greater than 0, not 0");
  expect_refused({"train", "--lr", "nan"}, "--lr: must be greater than 0, not nan");
  expect_refused({"bench", "train", "--bucket-cap-mb", "-1"}, "--bucket-cap-mb: must be greater than 0, not -1");
  // A negative final fraction made the cosine schedule's rate negative: gradient ascent, trained on silently.
  expect_refused({"train", "--lrf", "-0.5"}, "tandem: error: --lrf: must be between 0 and 1, not -0.5 (see --help)");
  expect_refused({"train", "--lrf", "1.5"}, "--lrf: must be between 0 and 1, not 1.5");
  expect_refused({"train", "--lrf", "nan"}, "--lrf: must be between 0 and 1, not nan");
}

// Text that is no number of the flag's type is left to CLI11's conversion error, not let through.
TEST(FlagChecks, TextOfAnotherTypeGetsTheConversionError) {
  expect_refused({"train", "--epochs", "1.5"}, "--epochs = 1.5");
  expect_refused({"train", "--lr", "fast"}, "--lr = fast");
}

TEST(FlagChecks, TheBoundsThemselvesAreAccepted) {
  // CLI11 checks the values before it acts on --help, so with --help a command line that passes every check
  // exits 0 without training, and one that fails a check still exits 2.
  ASSERT_EQ(run_tandem({"train", "--epochs", "0", "--help"}).exit_code, 2);
  const std::vector<std::vector<std::string>> at_the_bounds = {
      {"train", "--epochs", "1"},          {"train", "--keep-checkpoints", "0"},
      {"train", "--val-split", "0"},       {"train", "--val-split", "0.99"},
      {"train", "--min-crop-scale", "0.01"}, {"train", "--min-crop-scale", "1"},
      {"train", "--lr", "1e-9"},           {"train", "--lrf", "0"},
      {"train", "--lrf", "1"},             {"bench", "train", "--rounds", "1"},
      {"bench", "train", "--powersgd-start", "2"},
  };
  for (std::vector<std::string> args : at_the_bounds) {
    args.push_back("--help");
    const testing::ProcessResult result = run_tandem(args);
    EXPECT_EQ(result.exit_code, 0) << args[args.size() - 3] << " " << args[args.size() - 2] << ": "
                                   << result.output.substr(0, 300);
  }
}

}  // namespace
}  // namespace tandem::app
