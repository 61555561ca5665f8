#include "support/bad_input.h"

#include <gtest/gtest.h>

#include <sstream>

namespace tandem::testing {
namespace {

std::vector<std::string> lines_of(const std::string& output) {
  std::vector<std::string> lines;
  std::istringstream stream(output);
  for (std::string line; std::getline(stream, line);) {
    if (!line.empty()) lines.push_back(line);
  }
  return lines;
}

bool holds_all(const std::string& line, const std::vector<std::string>& mentions) {
  for (const std::string& mention : mentions) {
    if (line.find(mention) == std::string::npos) return false;
  }
  return true;
}

}  // namespace

void PrintTo(const BadInput& input, std::ostream* out) {
  *out << input.name << ": tandem";
  for (const std::string& arg : input.args) *out << ' ' << arg;
}

ProcessResult expect_one_line_refusal(const BadInput& input) {
  std::vector<std::string> argv = {tandem_cli()};
  argv.insert(argv.end(), input.args.begin(), input.args.end());
  ProcessResult result = run_process(argv, input.env, std::chrono::seconds(120));
  EXPECT_FALSE(result.timed_out) << result.output;
  EXPECT_EQ(result.term_signal, 0) << result.output;
  EXPECT_EQ(result.exit_code, input.exit_code) << result.output;
  const std::vector<std::string> lines = lines_of(result.output);
  for (const std::string& line : lines) {
    EXPECT_EQ(line.find("frame #"), std::string::npos) << "a backtrace reached the user:\n" << result.output;
    EXPECT_EQ(line.find("Exception raised from"), std::string::npos) << "a backtrace reached the user:\n"
                                                                      << result.output;
    EXPECT_LE(line.size(), 500u) << "a line too long to read:\n" << line;
  }
  if (input.only_line) {
    EXPECT_EQ(lines.size(), 1u) << result.output;
    if (!lines.empty()) {
      EXPECT_TRUE(holds_all(lines.front(), input.mentions)) << result.output;
    }
    return result;
  }
  int error_lines = 0;
  for (const std::string& line : lines) {
    if (line.find("error:") != std::string::npos && holds_all(line, input.mentions)) ++error_lines;
  }
  EXPECT_GE(error_lines, 1) << "no error line holds every mention:\n" << result.output;
  return result;
}

}  // namespace tandem::testing
