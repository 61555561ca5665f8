#pragma once
// How the workers' output reaches the launcher's own stdout and stderr (docs/launcher.md, "Output"): each
// worker writes into two pipes; the launcher reads them when poll says so, cuts what it reads into lines
// (line_buffer.h) and writes each line with its rank's "[RANK] " prefix in one write, so lines of different
// ranks never mix, and unprefixed to the rank's log file.
//
// Private to the launcher; everything here runs on the thread that called launch().
#include <set>
#include <string>

#include "tandem/launch/line_buffer.h"

namespace tandem::launch {

// Writes everything, or gives up when `fd` refuses: returns false with errno set (a reader gone, a full disk).
// Worker output must never stop the launcher, so callers decide what a refusal costs.
bool write_all(int fd, const std::string& text);

// The launcher's own report about its workers, one line on stderr: "tandem run: " + message.
void report(const std::string& message);

// One of a worker's two output streams, on its way to the launcher's stdout or stderr.
struct OutputStream {
  int fd = -1;           // read end of the worker's pipe; -1 once it reached end of file
  int rank = 0;          // the prefix of its lines
  int terminal_fd = -1;  // the launcher's own stdout or stderr
  bool terminal_is_tty = false;
  int log_fd = -1;  // the rank's log file, or -1; owned by the launcher, which keeps it across attempts
  std::string log_path;
  LineBuffer lines;

  // The stream read from `pipe_fd`, which it makes non-blocking and owns from here on.
  static OutputStream from_pipe(int pipe_fd, int rank, int terminal_fd, int log_fd, const std::string& log_path);
};

// Passes the lines of every worker's streams on. One relay serves all of them, because they share the
// terminal's last line, where a partial line may stand.
class OutputRelay {
 public:
  // Reads what the stream holds; returns whether it read anything. Closes the stream at end of file.
  bool read(OutputStream& stream);
  // Passes on a last line without '\n' and closes the stream.
  void close(OutputStream& stream);

 private:
  void emit(const OutputStream& stream, const std::string& line, bool partial);
  void write_log(const OutputStream& stream, const std::string& line);

  bool partial_line_shown_ = false;  // the terminal's last line is a partial one (see emit)
  // Log files that refused a write: said once, then left alone (a full disk, an I/O error).
  std::set<int> refusing_logs_;
};

}  // namespace tandem::launch
