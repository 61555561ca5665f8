// Rank 0's progress bar as a person sees it. Under a real terminal (a pty from util-linux's `script`) the bar is
// redrawn in place, by `tandem train` alone and through `tandem run`, and only rank 0 draws one; without a
// terminal the output is plain lines with no carriage return or escape code. The bar and the line that ends
// each epoch number epochs alike, from 0.
#include <gtest/gtest.h>

#include <regex>
#include <set>
#include <string>
#include <vector>

#include "support/processes.h"
#include "support/tiny_datasets.h"

namespace tandem::testing {
namespace {

// A shell command line of `argv`, each word quoted.
std::string shell_line(const std::vector<std::string>& argv) {
  std::string line;
  for (const std::string& word : argv) {
    std::string quoted = "'";
    for (char c : word) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
    line += (line.empty() ? "" : " ") + quoted + "'";
  }
  return line;
}

// Runs `argv` with a pseudo-terminal as its stdin, stdout and stderr; returns what the terminal received.
ProcessResult run_in_terminal(const std::vector<std::string>& argv) {
  // -q: no "Script started" lines; -e: script's exit status is the command's; -f: flush as output arrives.
  return run_process({"script", "-qefc", shell_line(argv), "/dev/null"}, {{"TERM", "xterm"}},
                     std::chrono::seconds(180));
}

// 5 batches of 16 per rank and epoch on 1 rank, as many on each of 2.
std::vector<std::string> train_command(const std::string& name, int ranks) {
  return {tandem_cli(), "train", "--data", write_tiny_mnist(name, 80 * ranks, 10), "--epochs", "2",
          "--batch-size", "16", "--threads", "1", "--timeout", "60", "--run-dir", make_temp_dir(name) + "/run",
          "--no-report"};
}

std::vector<std::string> launched(int ranks, const std::vector<std::string>& command) {
  std::vector<std::string> argv = {tandem_cli(), "run", "--nproc-per-node", std::to_string(ranks), "--"};
  argv.insert(argv.end(), command.begin(), command.end());
  return argv;
}

size_t count(const std::string& text, const std::string& what) {
  size_t found = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++found;
  return found;
}

// Epochs 0 and 1 of a 2-epoch run, by every numbered mention; never an epoch 2.
void expect_epochs_numbered_from_zero(const std::string& output) {
  std::smatch match;
  std::string rest = output;
  std::set<std::string> numbers;
  const std::regex mention("\\[epoch ([0-9]+)\\]");
  while (std::regex_search(rest, match, mention)) {
    numbers.insert(match[1]);
    rest = match.suffix();
  }
  EXPECT_EQ(numbers, (std::set<std::string>{"0", "1"})) << output;
}

TEST(ProgressBar, OnATerminalRedrawsOneLineInPlace) {
  const ProcessResult result = run_in_terminal(train_command("progress_tty", 1));
  ASSERT_FALSE(result.timed_out) << result.output;
  ASSERT_EQ(result.exit_code, 0) << result.output;
  for (const std::string epoch : {"0", "1"}) {
    // Drawn at least at the epoch's first and last batch, each time from the line's start.
    EXPECT_GE(count(result.output, "\r[epoch " + epoch + "] ["), 2u) << result.output;
    EXPECT_NE(result.output.find("\r[epoch " + epoch + "] [########################] 5/5 "), std::string::npos)
        << result.output;
    EXPECT_NE(result.output.find("[epoch " + epoch + "] loss "), std::string::npos) << result.output;
  }
  expect_epochs_numbered_from_zero(result.output);
}

TEST(ProgressBar, ThroughTandemRunOnATerminalOnlyRankZeroDrawsAndTheBarStaysInPlace) {
  const ProcessResult result = run_in_terminal(launched(2, train_command("progress_tty_ranks", 2)));
  ASSERT_FALSE(result.timed_out) << result.output;
  ASSERT_EQ(result.exit_code, 0) << result.output;
  // The workers write into pipes, yet rank 0 drew a bar: the launcher told it that a terminal shows its output.
  // Each state the launcher reads before the bar's newline is drawn over the terminal's last line (back to its
  // start, cleared, redrawn); how many it reads depends on scheduling, so only whose they are is checked.
  EXPECT_EQ(count(result.output, "\r\x1b[K[1] "), 0u) << result.output;
  EXPECT_NE(result.output.find("[0] [epoch 0] [########################] 5/5 "), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("[0] [epoch 1] loss "), std::string::npos) << result.output;
  EXPECT_EQ(result.output.find("[1] [epoch 0] ["), std::string::npos) << "rank 1 drew a bar:\n" << result.output;
  EXPECT_EQ(result.output.find("[1] [epoch 0] batch"), std::string::npos) << result.output;
  expect_epochs_numbered_from_zero(result.output);
}

TEST(ProgressBar, WithoutATerminalPrintsPlainLinesOnly) {
  const ProcessResult result = run_process(launched(2, train_command("progress_plain", 2)), {},
                                           std::chrono::seconds(180));
  ASSERT_FALSE(result.timed_out) << result.output;
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_EQ(result.output.find('\r'), std::string::npos) << result.output;
  EXPECT_EQ(result.output.find('\x1b'), std::string::npos) << result.output;
  // "[0] [tandem rank 0/2] [epoch 0] batch 5/5 loss ...": the launcher's prefix, then the worker's log prefix.
  EXPECT_TRUE(std::regex_search(result.output, std::regex("\n\\[0\\] [^\n]*\\[epoch 0\\] batch 5/5 loss ")))
      << result.output;
  EXPECT_FALSE(std::regex_search(result.output, std::regex("\n\\[1\\] [^\n]*\\] batch [0-9]")))
      << "rank 1 printed progress:\n" << result.output;
  expect_epochs_numbered_from_zero(result.output);
}

}  // namespace
}  // namespace tandem::testing
