#pragma once
// How signals reach the launcher's poll loop: a self-pipe. The handlers only write the signal's number into the
// pipe, which is async-signal-safe on any thread; the loop polls the pipe's read end beside the workers' output
// and acts on the signals in order of arrival, outside any handler (docs/launcher.md, "Who kills whom").
//
// Private to the launcher: the pipe is process-wide, so at most one relay may exist at a time.
#include <signal.h>

#include <functional>
#include <utility>
#include <vector>

namespace tandem::launch {

// Owns the launcher's handlers of SIGINT, SIGTERM, SIGHUP (the signals it forwards to the workers) and SIGCHLD
// for the duration of launch(), ignores SIGPIPE meanwhile, and puts the previous dispositions back when
// destroyed.
class SignalRelay {
 public:
  // Throws Error when the pipe cannot be created.
  SignalRelay();
  ~SignalRelay();
  SignalRelay(const SignalRelay&) = delete;
  SignalRelay& operator=(const SignalRelay&) = delete;

  // The pipe's read end, to poll for POLLIN.
  int fd() const;
  // Calls `on_signal` with every signal that arrived since the last call, in order of arrival, until the pipe
  // is empty.
  void drain(const std::function<void(int signal)>& on_signal) const;

  // In a child forked while a relay is installed, before exec: gives every signal the relay handles or ignores
  // its default disposition back. Async-signal-safe.
  static void restore_defaults_in_child();

 private:
  void install(int signal, const struct sigaction& action);

  std::vector<std::pair<int, struct sigaction>> previous_;
};

}  // namespace tandem::launch
