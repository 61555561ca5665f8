#include "signal_relay.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

#include "tandem/util/error.h"

namespace tandem::launch {
namespace {

// Signals the launcher passes on to its workers; a second one while stopping escalates to SIGKILL.
constexpr int kForwardedSignals[] = {SIGINT, SIGTERM, SIGHUP};

// Handlers may run on any thread, so the pipe is a global rather than a member.
int signal_pipe[2] = {-1, -1};

void on_signal(int signal) {
  int saved = errno;
  unsigned char byte = static_cast<unsigned char>(signal);
  ssize_t ignored = ::write(signal_pipe[1], &byte, 1);
  (void)ignored;
  errno = saved;
}

}  // namespace

SignalRelay::SignalRelay() {
  if (::pipe2(signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0) throw Error("cannot create the launcher's signal pipe");
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  for (int signal : kForwardedSignals) install(signal, action);
  action.sa_flags |= SA_NOCLDSTOP;
  install(SIGCHLD, action);
  // A closed terminal or `| head` must not kill the launcher (and with it, abruptly, every worker).
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  install(SIGPIPE, ignore);
}

SignalRelay::~SignalRelay() {
  for (auto& [signal, previous] : previous_) ::sigaction(signal, &previous, nullptr);
  ::close(signal_pipe[0]);
  ::close(signal_pipe[1]);
  signal_pipe[0] = signal_pipe[1] = -1;
}

int SignalRelay::fd() const { return signal_pipe[0]; }

void SignalRelay::drain(const std::function<void(int signal)>& on_signal) const {
  unsigned char signals[64];
  ssize_t got;
  while ((got = ::read(signal_pipe[0], signals, sizeof(signals))) > 0) {
    for (ssize_t i = 0; i < got; ++i) on_signal(signals[i]);
  }
}

void SignalRelay::restore_defaults_in_child() {
  struct sigaction default_action {};
  default_action.sa_handler = SIG_DFL;
  for (int signal : {SIGINT, SIGTERM, SIGHUP, SIGCHLD, SIGPIPE}) ::sigaction(signal, &default_action, nullptr);
}

void SignalRelay::install(int signal, const struct sigaction& action) {
  previous_.push_back({signal, {}});
  ::sigaction(signal, &action, &previous_.back().second);
}

}  // namespace tandem::launch
