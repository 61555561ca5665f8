// The `tandem` program's numeric flags (apps/flag_checks.h): a value out of range is one short line naming the
// flag, the value and what the flag accepts, up to the largest value of the flag's type, where CLI11's own checks
// printed "Value -3 not in range 0.000000 to 1797693134862315708...000000" with all 300 digits of the double's
// limit, and its conversion "Could not convert" with no range at all. The checks first on their own, then through
// the built binary.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "apps/flag_checks.h"
#include "support/processes.h"

namespace tandem::app::flag_checks {
namespace {

// The check's refusal of `text`, empty where it accepts it.
std::string refusal(const CLI::Validator& check, std::string text) { return check(text); }

TEST(FlagChecks, WholeNumbersRunToTheirTypesLargestValue) {
  EXPECT_EQ(refusal(at_least<int>(1), "2147483647"), "");
  EXPECT_EQ(refusal(at_least<int>(1), "2147483648"), "must be a whole number from 1 to 2147483647, not 2147483648");
  EXPECT_EQ(refusal(at_least<int64_t>(0), "9223372036854775807"), "");
  // strtoll saturates here, and CLI11 took the result for the largest int64_t.
  EXPECT_EQ(refusal(at_least<int64_t>(0), "99999999999999999999"),
            "must be a whole number from 0 to 9223372036854775807, not 99999999999999999999");
  EXPECT_EQ(refusal(at_least<uint64_t>(0), "18446744073709551615"), "");
  EXPECT_EQ(refusal(at_least<uint64_t>(0), "18446744073709551616"),
            "must be a whole number from 0 to 18446744073709551615, not 18446744073709551616");
  EXPECT_EQ(refusal(between<int>(1, 1024), "1025"), "must be a whole number from 1 to 1024, not 1025");
}

// strtoull reads "-1" as the largest value: an unsigned flag would take it without a word.
TEST(FlagChecks, UnsignedFlagsRefuseEveryNegative) {
  for (const char* text : {"-1", "-0", " -5", "-18446744073709551615"}) {
    EXPECT_EQ(refusal(at_least<uint64_t>(0), text), std::string("must be a whole number from 0 to 18446744073709551615, not ") + text);
  }
}

TEST(FlagChecks, RealsMustBeFiniteAndFitTheirType) {
  EXPECT_EQ(refusal(greater_than<float>(0), "3.4e38"), "");
  EXPECT_EQ(refusal(greater_than<float>(0), "1e39"), "must be greater than 0 and at most 3.4028235e+38, not 1e39");
  EXPECT_NE(refusal(greater_than<double>(0), "inf"), "");
  EXPECT_NE(refusal(greater_than<double>(0), "1e400"), "");
  EXPECT_NE(refusal(between(0, 1), "nan"), "");
  EXPECT_NE(refusal(at_least<float>(0), "-inf"), "");
  EXPECT_EQ(refusal(at_least_and_below(0, 1), "0.999"), "");
  EXPECT_EQ(refusal(at_least_and_below(0, 1), "1"), "must be at least 0 and below 1, not 1");
}

TEST(FlagChecks, ParsedTextIsRefusedWhereTheParserThrows) {
  const CLI::Validator check = parsed_by(
      [](const std::string& text) {
        if (text != "ok") throw std::invalid_argument("the parser's own words");
      },
      "the word ok");
  EXPECT_EQ(refusal(check, "ok"), "");
  EXPECT_EQ(refusal(check, "ko"), "must be the word ok, not ko");
}

// What passes a check is what CLI11 then converts, within the range: no flag reaches a conversion error or holds
// a value its check refused.
template <typename Whole>
void expect_passed_means_converted(const CLI::Validator& check, Whole low, Whole high) {
  for (const char* text : {"0", "1", "-1", "+7", "010", "0x10", "08", "1.5", "1e3", "", " 3", "3 ", "x",
                           "2147483647", "2147483648", "-2147483649", "9223372036854775807", "9223372036854775808",
                           "18446744073709551615", "18446744073709551616", "-9223372036854775808"}) {
    if (!refusal(check, text).empty()) continue;
    Whole value{};
    EXPECT_TRUE(CLI::detail::lexical_cast(std::string(text), value)) << "'" << text << "' passed and did not convert";
    EXPECT_TRUE(value >= low && value <= high) << "'" << text << "' passed as " << value;
  }
}

TEST(FlagChecks, WhatPassesConvertsIntoTheRange) {
  expect_passed_means_converted<int>(at_least<int>(1), 1, INT32_MAX);
  expect_passed_means_converted<int>(between<int>(0, 1024), 0, 1024);
  expect_passed_means_converted<int64_t>(at_least<int64_t>(0), 0, INT64_MAX);
  expect_passed_means_converted<uint64_t>(at_least<uint64_t>(0), 0, UINT64_MAX);
}

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
  expect_refused({"train", "--epochs", "-3"},
                 "tandem: error: --epochs: must be a whole number from 1 to 2147483647, not -3 (see --help)");
  expect_refused({"train", "--batch-size", "0"}, "--batch-size: must be a whole number from 1 to 9223372036854775807, not 0");
  expect_refused({"train", "--keep-checkpoints", "-1"}, "--keep-checkpoints: must be a whole number from 0 to 2147483647, not -1");
  // The bench flags' own types set their largest values.
  expect_refused({"bench", "train", "--rounds", "0"}, "--rounds: must be a whole number from 1 to ");
  expect_refused({"bench", "train", "--powersgd-start", "1"}, "--powersgd-start: must be a whole number from 2 to ");
}

TEST(FlagChecks, RealNumberOutsideItsRangeIsOneShortLine) {
  expect_refused({"train", "--val-split", "1.5"},
                 "tandem: error: --val-split: must be between 0 and 0.99, not 1.5 (see --help)");
  expect_refused({"train", "--min-crop-scale", "0"}, "--min-crop-scale: must be between 0.01 and 1, not 0");
  expect_refused({"train", "--lr", "0"}, "--lr: must be greater than 0 and at most 3.4028235e+38, not 0");
  expect_refused({"train", "--lr", "nan"}, "--lr: must be greater than 0 and at most 3.4028235e+38, not nan");
  expect_refused({"bench", "train", "--bucket-cap-mb", "-1"}, "--bucket-cap-mb: must be ");
  // A negative final fraction made the cosine schedule's rate negative: gradient ascent, trained on silently.
  expect_refused({"train", "--lrf", "-0.5"}, "tandem: error: --lrf: must be between 0 and 1, not -0.5 (see --help)");
  expect_refused({"train", "--lrf", "1.5"}, "--lrf: must be between 0 and 1, not 1.5");
  expect_refused({"train", "--lrf", "nan"}, "--lrf: must be between 0 and 1, not nan");
}

// Text that is no number of the flag's type gets the flag's range too, not CLI11's bare "Could not convert".
TEST(FlagChecks, TextOfAnotherTypeGetsTheRange) {
  expect_refused({"train", "--epochs", "1.5"}, "--epochs: must be a whole number from 1 to 2147483647, not 1.5");
  expect_refused({"train", "--lr", "fast"}, "--lr: must be greater than 0 and at most 3.4028235e+38, not fast");
}

TEST(FlagChecks, TheBoundsThemselvesAreAccepted) {
  // CLI11 checks the values before it acts on --help, so with --help a command line that passes every check
  // exits 0 without training, and one that fails a check still exits 2 (naming the flag).
  ASSERT_EQ(run_tandem({"train", "--epochs", "0", "--help"}).exit_code, 2);
  const std::vector<std::vector<std::string>> at_the_bounds = {
      {"train", "--epochs", "1", "--batch-size", "1", "--keep-checkpoints", "0", "--seed", "0", "--steps", "0",
       "--threads", "0", "--image-size", "1", "--num-classes", "1", "--val-split", "0", "--min-crop-scale", "0.01",
       "--lr", "1e-9", "--lrf", "0", "--momentum", "0", "--weight-decay", "0", "--timeout", "1",
       "--timeline-steps", "1-1", "--dp-replicas", "1", "--help"},
      {"train", "--epochs", "2147483647", "--batch-size", "9223372036854775807", "--keep-checkpoints", "2147483647",
       "--seed", "18446744073709551615", "--steps", "9223372036854775807", "--threads", "1024", "--image-size", "1024",
       "--num-classes", "100000", "--val-split", "0.99", "--min-crop-scale", "1", "--lr", "3.4e38", "--lrf", "1",
       "--momentum", "0.999", "--weight-decay", "3.4e38", "--timeout", "31536000", "--normalize", "0,1e-3",
       "--dp-replicas", "1024", "--help"},
      {"bench", "train", "--rounds", "1", "--powersgd-start", "2", "--help"},
  };
  for (const std::vector<std::string>& args : at_the_bounds) {
    const testing::ProcessResult result = run_tandem(args);
    EXPECT_EQ(result.exit_code, 0) << result.output.substr(0, 300);
  }
}

}  // namespace
}  // namespace tandem::app::flag_checks
