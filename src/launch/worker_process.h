#pragma once
// Starting one worker process of `tandem run` (docs/launcher.md, "Who kills whom"): in a process group of its
// own, so that one kill() reaches everything it starts and the terminal's Ctrl-C reaches only the launcher;
// killed by the kernel if the launcher dies first; stdin from /dev/null, stdout and stderr into pipes that
// the launcher reads.
//
// Private to the launcher. Call while a SignalRelay is installed: the child resets what the relay changed.
#include <sys/types.h>

#include <map>
#include <string>
#include <vector>

namespace tandem::launch {

// A started worker, or a command that could not be executed.
struct WorkerProcess {
  pid_t pid = -1;      // also the id of its process group; -1 when exec failed
  int stdout_fd = -1;  // read ends of the pipes its stdout and stderr write into, owned by the caller from here
  int stderr_fd = -1;
  int heartbeat_fd = -1;  // the read end of its heartbeat pipe, where one was asked for; owned by the caller
  int exec_errno = 0;  // exec's errno when it failed (the child is then already reaped, and no pipe is open)
};

// The launcher's own environment, as "NAME=value" entries, with `overrides` set in it.
std::vector<std::string> environment_with(const std::map<std::string, std::string>& overrides);

// The descriptor a worker finds its heartbeat pipe on (comm::kHeartbeatVariable names it in its environment).
inline constexpr int kHeartbeatFd = 3;

// Runs `command` (looked up in PATH when it has no '/') with exactly `environment`. A failed exec is found out
// for certain, through a close-on-exec pipe that carries exec's errno, not guessed from an exit code. With
// `heartbeat`, the worker also gets the write end of a pipe on kHeartbeatFd, non-blocking, for its heartbeats.
// Throws Error naming `rank` when the pipes cannot be created or fork fails.
WorkerProcess spawn_worker(const std::vector<std::string>& command, std::vector<std::string> environment, int rank,
                           bool heartbeat = false);

// The line for a `program` that spawn_worker could not execute: "cannot execute 'x' for rank 0: No such file or
// directory (not found in PATH)".
std::string exec_failure_message(const std::string& program, int rank, int exec_errno);

}  // namespace tandem::launch
