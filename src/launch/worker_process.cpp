#include "worker_process.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "signal_relay.h"
#include "tandem/util/error.h"

extern char** environ;

namespace tandem::launch {
namespace {

// execvpe's view of `strings`: pointers into them, ending in a null pointer.
std::vector<char*> c_strings(std::vector<std::string>& strings) {
  std::vector<char*> pointers;
  for (auto& text : strings) pointers.push_back(text.data());
  pointers.push_back(nullptr);
  return pointers;
}

// The child's side of spawn_worker: only async-signal-safe calls until exec, since the launcher may have other
// threads. On a failed exec, writes its errno into `exec_status`.
[[noreturn]] void exec_worker(char* const* argv, char* const* envp, pid_t launcher, int dev_null, int out, int err,
                              int heartbeat, int exec_status) {
  SignalRelay::restore_defaults_in_child();
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  // Its own process group, so one kill() reaches everything it starts, and the terminal's Ctrl-C reaches
  // only the launcher, which forwards it exactly once.
  ::setpgid(0, 0);
  // If the launcher dies without cleaning up (SIGKILL), the kernel kills the worker.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != launcher) ::_exit(128 + SIGKILL);
  if (dev_null >= 0) ::dup2(dev_null, STDIN_FILENO);
  ::dup2(out, STDOUT_FILENO);
  ::dup2(err, STDERR_FILENO);
  // dup2 onto itself would keep close-on-exec set.
  if (heartbeat == kHeartbeatFd) ::fcntl(heartbeat, F_SETFD, 0);
  if (heartbeat >= 0 && heartbeat != kHeartbeatFd) ::dup2(heartbeat, kHeartbeatFd);
  ::execvpe(argv[0], argv, envp);
  int error = errno;
  ssize_t ignored = ::write(exec_status, &error, sizeof(error));
  (void)ignored;
  ::_exit(127);
}

// The status pipe closes on a successful exec (0), or carries exec's errno.
int read_exec_errno(int exec_status) {
  int exec_errno = 0;
  ssize_t got;
  do {
    got = ::read(exec_status, &exec_errno, sizeof(exec_errno));
  } while (got < 0 && errno == EINTR);
  return got == static_cast<ssize_t>(sizeof(exec_errno)) ? exec_errno : 0;
}

}  // namespace

std::vector<std::string> environment_with(const std::map<std::string, std::string>& overrides) {
  std::vector<std::string> entries;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    std::string text(*entry);
    if (overrides.count(text.substr(0, text.find('='))) == 0) entries.push_back(std::move(text));
  }
  for (const auto& [name, value] : overrides) entries.push_back(name + "=" + value);
  return entries;
}

WorkerProcess spawn_worker(const std::vector<std::string>& command, std::vector<std::string> environment, int rank,
                           bool heartbeat) {
  std::vector<char*> envp = c_strings(environment);
  std::vector<std::string> args = command;
  std::vector<char*> argv = c_strings(args);

  int out[2], err[2], exec_status[2], beats[2] = {-1, -1};
  if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0 || ::pipe2(exec_status, O_CLOEXEC) != 0 ||
      (heartbeat && ::pipe2(beats, O_CLOEXEC | O_NONBLOCK) != 0)) {
    throw Error(fmt::format("cannot create pipes for rank {}: {}", rank, std::strerror(errno)));
  }
  int dev_null = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  const pid_t launcher = ::getpid();

  // With every signal blocked across fork, the child cannot run the launcher's handlers before it resets them.
  sigset_t all, previous;
  sigfillset(&all);
  ::pthread_sigmask(SIG_SETMASK, &all, &previous);
  pid_t pid = ::fork();
  if (pid == 0) {
    exec_worker(argv.data(), envp.data(), launcher, dev_null, out[1], err[1], beats[1], exec_status[1]);
  }
  int fork_error = errno;
  ::pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  for (int fd : {out[1], err[1], exec_status[1], dev_null, beats[1]}) {
    if (fd >= 0) ::close(fd);
  }
  if (pid < 0) {
    for (int fd : {out[0], err[0], exec_status[0], beats[0]}) {
      if (fd >= 0) ::close(fd);
    }
    throw Error(fmt::format("cannot start rank {}: fork failed: {}", rank, std::strerror(fork_error)));
  }
  ::setpgid(pid, pid);  // also here, so no kill(-pid) can race the child's own setpgid

  int exec_errno = read_exec_errno(exec_status[0]);
  ::close(exec_status[0]);
  if (exec_errno != 0) {
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    for (int fd : {out[0], err[0], beats[0]}) {
      if (fd >= 0) ::close(fd);
    }
    return {-1, -1, -1, -1, exec_errno};
  }
  return {pid, out[0], err[0], beats[0], 0};
}

std::string exec_failure_message(const std::string& program, int rank, int exec_errno) {
  const bool not_in_path = exec_errno == ENOENT && program.find('/') == std::string::npos;
  return fmt::format("cannot execute '{}' for rank {}: {}{}", program, rank, std::strerror(exec_errno),
                     not_in_path ? " (not found in PATH)" : "");
}

}  // namespace tandem::launch
