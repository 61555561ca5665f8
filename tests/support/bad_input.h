#pragma once
// The bad-input tier: a wrong command line given to the built `tandem` program must end in one line that names
// what was wrong (the flag, the file or the value), a non-zero exit, and never a LibTorch backtrace. Each
// subcommand's test holds a table of BadInput rows and checks every row with expect_one_line_refusal.
#include <map>
#include <ostream>
#include <string>
#include <vector>

#include "support/processes.h"

namespace tandem::testing {

struct BadInput {
  std::string name;                   // the row's name in the test's output (letters, digits and _ only)
  std::vector<std::string> args;      // after `tandem`
  std::vector<std::string> mentions;  // text the error line must hold: the flag, the file, the value, the remedy
  int exit_code = 2;                  // 2: a wrong command line or option; 1: a failure while running
  // true: the refusal is the program's only output (checked before any work). false: other lines may come
  // first (a run that fails in its second epoch, a launcher that relays its workers' lines); at least one of
  // them is an error line ("error:") holding every mention.
  bool only_line = true;
  std::map<std::string, std::string> env = {};
};

// gtest prints a parameter with this: the row's name and its command line.
void PrintTo(const BadInput& input, std::ostream* out);

// Runs `tandem ARGS` with a 120 s deadline and checks the refusal as described above. A line that holds
// "frame #" or "Exception raised from" (LibTorch's backtrace) fails the check, as does a line over 500
// characters: one line is meant to be read.
ProcessResult expect_one_line_refusal(const BadInput& input);

}  // namespace tandem::testing
