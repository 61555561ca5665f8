#include "output_relay.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace tandem::launch {

bool write_all(int fd, const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    ssize_t wrote = ::write(fd, text.data() + done, text.size() - done);
    if (wrote > 0) {
      done += static_cast<size_t>(wrote);
    } else if (wrote < 0 && errno == EAGAIN) {
      pollfd wait{fd, POLLOUT, 0};
      ::poll(&wait, 1, 100);
    } else if (!(wrote < 0 && errno == EINTR)) {
      if (wrote == 0) errno = EIO;
      return false;
    }
  }
  return true;
}

void report(const std::string& message) { write_all(STDERR_FILENO, "tandem run: " + message + "\n"); }

OutputStream OutputStream::from_pipe(int pipe_fd, int rank, int terminal_fd, int log_fd, const std::string& log_path) {
  // Non-blocking, so that a read the poll loop starts never waits for one worker while the others talk.
  ::fcntl(pipe_fd, F_SETFL, ::fcntl(pipe_fd, F_GETFL) | O_NONBLOCK);
  return {pipe_fd, rank, terminal_fd, ::isatty(terminal_fd) == 1, log_fd, log_path, {}};
}

bool OutputRelay::read(OutputStream& stream) {
  char buffer[64 * 1024];
  ssize_t got = ::read(stream.fd, buffer, sizeof(buffer));
  if (got < 0 && (errno == EAGAIN || errno == EINTR)) return false;
  if (got <= 0) {
    close(stream);
    return false;
  }
  stream.lines.feed(buffer, static_cast<size_t>(got),
                    [&](const std::string& line, bool partial) { emit(stream, line, partial); });
  return true;
}

void OutputRelay::close(OutputStream& stream) {
  stream.lines.flush([&](const std::string& line, bool partial) { emit(stream, line, partial); });
  ::close(stream.fd);
  stream.fd = -1;
}

// A terminal or pipe that refuses (its reader gone) is not the run's business; a log file that refuses is lost
// output, said once on the launcher's stderr while the lines go on to the terminal.
void OutputRelay::write_log(const OutputStream& stream, const std::string& line) {
  if (stream.log_fd < 0 || refusing_logs_.count(stream.log_fd) != 0) return;
  if (write_all(stream.log_fd, line)) return;
  const int error = errno;
  refusing_logs_.insert(stream.log_fd);
  report(fmt::format("cannot write rank {}'s log file '{}' ({}); its later lines reach only the terminal; free "
                     "space on that disk, or log to another folder",
                     stream.rank, stream.log_path, std::strerror(error)));
}

// One write per line keeps the ranks' lines whole on the terminal. A partial line (a progress bar's state)
// is drawn over the terminal's last line and left there without a newline; the next whole line from any
// rank first clears it. Files and pipes get whole lines only.
void OutputRelay::emit(const OutputStream& stream, const std::string& line, bool partial) {
  constexpr const char* kClearLine = "\r\x1b[K";
  if (partial) {
    if (!stream.terminal_is_tty) return;
    write_all(stream.terminal_fd, fmt::format("{}[{}] {}", kClearLine, stream.rank, line));
    partial_line_shown_ = true;
    return;
  }
  const bool clear = partial_line_shown_ && stream.terminal_is_tty;
  write_all(stream.terminal_fd, fmt::format("{}[{}] {}\n", clear ? kClearLine : "", stream.rank, line));
  if (stream.terminal_is_tty) partial_line_shown_ = false;
  write_log(stream, line + "\n");
}

}  // namespace tandem::launch
