#pragma once
// How one worker of `tandem run` ended, in the words and exit codes a shell would use (docs/launcher.md, "Exit
// codes and the one line").
#include <string>

namespace tandem::launch {

// How one worker ended.
struct WorkerExit {
  int rank = 0;
  int exit_code = 0;  // when it exited
  int signal = 0;     // non-zero when a signal killed it

  bool failed() const { return signal != 0 || exit_code != 0; }
  // What a shell would report: the code, or 128 + the signal number.
  int shell_code() const { return signal != 0 ? 128 + signal : exit_code; }
  // "exited with code 7" or "was killed by signal SIGKILL (9)".
  std::string describe() const;
};

// "SIGTERM", "SIGKILL", ...; "signal 42" for one without a name here.
std::string signal_name(int signal);

}  // namespace tandem::launch
