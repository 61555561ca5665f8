#include "supervisor.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

#include "tandem/comm/membership.h"
#include "tandem/launch/worker_environment.h"
#include "tandem/util/error.h"
#include "worker_process.h"

namespace tandem::launch {
namespace {

using Clock = std::chrono::steady_clock;

// How long SIGKILLed processes get to vanish before the launcher stops waiting (only a process stuck in
// uninterruptible I/O takes longer).
constexpr std::chrono::seconds kKillWait{10};
// While stopping, how often to look whether the workers' process groups are empty: members that are not the
// launcher's children send it no SIGCHLD.
constexpr int kStopPollMs = 20;
// Under in-job recovery, while a replacement starts or other nodes may report: how often to look in the store.
constexpr int kReadyPollMs = 20;
// Under in-job recovery: a worker whose heartbeat (comm::kHeartbeatVariable, every 250 ms from a thread of its own)
// stood still this long is stopped or frozen whole; it is killed, and the others go on without it. Far above
// the interval, so that a loaded machine does not cost a healthy worker its place.
constexpr std::chrono::seconds kHeartbeatLostAfter{5};
constexpr int kHeartbeatPollMs = 250;

}  // namespace

std::string describe_end(const AttemptEnd& end) {
  switch (end.kind) {
    case AttemptEnd::Kind::kNotRun:
      return end.exec_failure;
    case AttemptEnd::Kind::kFailed: {
      std::string log = end.failed_log_path.empty() ? "" : fmt::format(" (log: {})", end.failed_log_path);
      return fmt::format("rank {} {}{}; stopped the other {} worker(s)", end.failure.rank, end.failure.describe(), log,
                         end.stopped_others);
    }
    case AttemptEnd::Kind::kSignalled:
      return fmt::format("received {}; forwarded it to the {} worker(s) and stopped them", signal_name(end.signal),
                         end.workers);
    case AttemptEnd::Kind::kStopped:
      return fmt::format("stopped the {} worker(s)", end.workers);
    case AttemptEnd::Kind::kSucceeded:
      break;
  }
  return {};
}

int exit_code_of(const AttemptEnd& end) {
  switch (end.kind) {
    case AttemptEnd::Kind::kNotRun:
      return end.exec_failure_code;
    case AttemptEnd::Kind::kFailed:
      return end.failure.shell_code();
    case AttemptEnd::Kind::kSignalled:
      return 128 + end.signal;
    case AttemptEnd::Kind::kStopped:
      return 1;
    case AttemptEnd::Kind::kSucceeded:
      break;
  }
  return 0;
}

Supervisor::~Supervisor() {
  for (Worker& worker : workers_) {
    for (int fd : {worker.out.fd, worker.err.fd, worker.heartbeat_fd}) {
      if (fd >= 0) ::close(fd);
    }
  }
  for (const auto& [path, fd] : log_fds_) ::close(fd);
}

int Supervisor::log_fd(const std::string& path) {
  if (path.empty()) return -1;
  auto found = log_fds_.find(path);
  if (found != log_fds_.end()) return found->second;
  std::error_code error;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), error);
  if (error) {
    throw InvalidArgument(fmt::format("`log_dir` '{}' cannot be created ({}); give a folder that tandem run can "
                                      "create and write in",
                                      std::filesystem::path(path).parent_path().string(), error.message()));
  }
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    throw InvalidArgument(fmt::format("cannot write the log file '{}' in `log_dir` ({}); give a folder that "
                                      "tandem run can write in",
                                      path, std::strerror(errno)));
  }
  log_fds_[path] = fd;
  return fd;
}

std::vector<std::string> Supervisor::environment_for(const LaunchPlan& plan, int local_rank, int restart,
                                                     const std::map<std::string, std::string>& store_variables) const {
  auto overrides = worker_environment(plan, local_rank, restart, comm::process_environment(), usable_cpu_count());
  overrides.insert(store_variables.begin(), store_variables.end());
  // The workers write into pipes; rank 0's progress bar needs to know that the launcher shows them on a
  // terminal, which redraws a line in place (see OutputRelay::emit).
  if (::isatty(STDERR_FILENO) == 1) overrides["TANDEM_TERMINAL"] = "1";
  if (recovery_ != nullptr) overrides[comm::kHeartbeatVariable] = std::to_string(kHeartbeatFd);
  return environment_with(overrides);
}

AttemptEnd Supervisor::run_attempt(const LaunchPlan& plan, int restart_count,
                                   const std::map<std::string, std::string>& store_variables, int stop_fd,
                                   InJobRecovery* recovery) {
  plan_ = &plan;
  restart_ = restart_count;
  store_variables_ = &store_variables;
  recovery_ = recovery;
  replacements_due_.clear();
  workers_.assign(static_cast<size_t>(plan.nproc_per_node), Worker{});
  for (int local = 0; local < plan.nproc_per_node; ++local) {
    Worker& worker = workers_[static_cast<size_t>(local)];
    worker.local_rank = local;
    worker.exit.rank = plan.global_rank(local);
    worker.log_path = plan.log_path(local);
    worker.log_fd = log_fd(worker.log_path);
  }
  phase_ = Phase::kRunning;
  end_ = AttemptEnd{};
  end_.workers = plan.nproc_per_node;
  cause_known_ = false;
  handle_signals();
  if (interrupt_signal_ != 0) {
    end_.kind = AttemptEnd::Kind::kSignalled;
    end_.signal = interrupt_signal_;
    return end_;
  }
  start_workers(plan, restart_count, store_variables);
  supervise(stop_fd);
  handle_signals();
  // Their process groups are empty: a signal between attempts must not reach a group id the kernel reused.
  for (Worker& worker : workers_) {
    worker.pid = -1;
    if (worker.heartbeat_fd >= 0) ::close(worker.heartbeat_fd);
    worker.heartbeat_fd = -1;
  }
  return end_;
}

int Supervisor::wait_for_signal(std::chrono::milliseconds wait) {
  if (interrupt_signal_ == 0) {
    pollfd fd{signals_.fd(), POLLIN, 0};
    ::poll(&fd, 1, static_cast<int>(wait.count()));
    handle_signals();
  }
  return interrupt_signal_;
}

void Supervisor::start_workers(const LaunchPlan& plan, int restart,
                               const std::map<std::string, std::string>& store_variables) {
  // Orphans of the workers (a shell's children, say) are re-parented to the launcher, so it can reap them
  // and know when a worker's whole process group is gone.
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  for (Worker& worker : workers_) {
    if (!start_worker(worker, environment_for(plan, worker.local_rank, restart, store_variables),
                      plan.command.front())) {
      return;
    }
  }
}

bool Supervisor::start_worker(Worker& worker, const std::vector<std::string>& environment,
                              const std::string& program) {
  WorkerProcess process = spawn_worker(plan_->command, environment, worker.exit.rank, recovery_ != nullptr);
  if (process.exec_errno == 0) {
    worker.pid = process.pid;
    worker.running = true;
    worker.heartbeat_fd = process.heartbeat_fd;
    worker.out =
        OutputStream::from_pipe(process.stdout_fd, worker.exit.rank, STDOUT_FILENO, worker.log_fd, worker.log_path);
    worker.err =
        OutputStream::from_pipe(process.stderr_fd, worker.exit.rank, STDERR_FILENO, worker.log_fd, worker.log_path);
    return true;
  }
  end_.kind = AttemptEnd::Kind::kNotRun;
  end_.exec_failure_code = process.exec_errno == ENOENT ? 127 : 126;
  end_.exec_failure = exec_failure_message(program, worker.exit.rank, process.exec_errno);
  cause_known_ = true;
  begin_stop(SIGTERM);
  return false;
}

// A lost worker that in-job recovery recovers stops nobody: the members go on without it, and its replacement,
// if one is allowed, starts at the next turn of the supervising loop.
bool Supervisor::recovers(const Worker& worker) {
  if (recovery_ == nullptr) return false;
  int members_running = 0;
  for (const Worker& other : workers_) members_running += other.running && !other.awaiting ? 1 : 0;
  const InJobRecovery::Loss loss =
      recovery_->lose(worker.exit.rank, worker.exit.signal != 0 ? -1 : worker.exit.exit_code, members_running);
  if (!loss.recovered) return false;
  const std::string next =
      loss.replace ? fmt::format("; starting its replacement (restart {} of {})",
                                 plan_->max_restarts - recovery_->replacements_allowed() + loss.replacements_used,
                                 plan_->max_restarts)
                   : "; no restart is left to replace it";
  report(fmt::format("rank {} {}; the others go on without it (in-job recovery){}", worker.exit.rank,
                     worker.exit.describe(), next));
  if (loss.replace) replacements_due_.push_back(worker.local_rank);
  return true;
}

void Supervisor::recover_in_job() {
  for (int local_rank : std::exchange(replacements_due_, {})) {
    Worker replacement;
    replacement.local_rank = local_rank;
    replacement.exit.rank = plan_->global_rank(local_rank);
    replacement.log_path = plan_->log_path(local_rank);
    replacement.log_fd = log_fd(replacement.log_path);
    replacement.awaiting = true;
    std::map<std::string, std::string> variables = *store_variables_;
    variables[comm::kReplacementVariable] = "1";
    workers_.push_back(std::move(replacement));
    if (!start_worker(workers_.back(), environment_for(*plan_, local_rank, restart_, variables),
                      plan_->command.front())) {
      return;
    }
  }
  recovery_->take_in_ready();
  // A replacement counts as a member once it formed the membership with the others, not when it is published:
  // members that end the run first never take it in, and it ends by itself.
  for (int slot : recovery_->joined()) {
    for (Worker& worker : workers_) worker.awaiting = worker.awaiting && !(worker.exit.rank == slot && worker.running);
    report(fmt::format("rank {}'s replacement is taken in (membership epoch {})", slot, recovery_->epoch()));
  }
}

// A beat, or the end of the worker's membership (not judged from then on, until it beats again); the end of the
// pipe is the worker's end, which SIGCHLD reports.
void Supervisor::read_heartbeat(Worker& worker) {
  char beats[64];
  ssize_t got;
  while ((got = ::read(worker.heartbeat_fd, beats, sizeof(beats))) > 0) {
    if (beats[got - 1] == comm::kHeartbeat) {
      worker.beaten = Clock::now();
    } else {
      worker.beaten.reset();
    }
  }
  if (got == 0 || (got < 0 && errno != EAGAIN && errno != EINTR)) {
    ::close(worker.heartbeat_fd);
    worker.heartbeat_fd = -1;
    worker.beaten.reset();
  }
}

// A worker alive but silent (stopped, frozen) holds the others in their collectives until --timeout: once its
// heartbeat stood still for kHeartbeatLostAfter it is killed, and its loss is recovered as any other. A worker
// that never beat yet (starting: its libraries, its data) is not judged.
void Supervisor::kill_the_silent() {
  const auto now = Clock::now();
  for (Worker& worker : workers_) {
    if (!worker.running || !worker.beaten || now - *worker.beaten < kHeartbeatLostAfter) continue;
    report(fmt::format("rank {} sent no heartbeat for {} s (stopped or frozen); killing it", worker.exit.rank,
                       kHeartbeatLostAfter.count()));
    worker.beaten.reset();
    ::kill(-worker.pid, SIGKILL);
  }
}

void Supervisor::supervise(int stop_fd) {
  while (true) {
    bool any_running = false;
    for (const Worker& worker : workers_) any_running = any_running || worker.running;
    if (!any_running) {
      if (!any_group_alive()) break;
      // Every worker has exited but something it started lives on in its process group: stop it too.
      if (phase_ == Phase::kRunning) begin_stop(SIGTERM);
    }
    const auto now = Clock::now();
    if (phase_ == Phase::kStopping && now >= deadline_) {
      kill_all();
    } else if (phase_ == Phase::kKilling && now >= deadline_) {
      report(fmt::format("some processes of the workers survived SIGKILL for {} s; giving up on them",
                         kKillWait.count()));
      break;
    }

    std::vector<pollfd> fds{{signals_.fd(), POLLIN, 0}};
    const bool watch_stop = stop_fd >= 0 && phase_ == Phase::kRunning;
    if (watch_stop) fds.push_back({stop_fd, POLLIN, 0});
    const size_t first_stream = fds.size();
    std::vector<OutputStream*> streams;
    for (Worker& worker : workers_) {
      for (OutputStream* stream : {&worker.out, &worker.err}) {
        if (stream->fd < 0) continue;
        fds.push_back({stream->fd, POLLIN, 0});
        streams.push_back(stream);
      }
    }
    const size_t first_heartbeat = fds.size();
    std::vector<Worker*> beating;
    for (Worker& worker : workers_) {
      if (worker.heartbeat_fd < 0) continue;
      fds.push_back({worker.heartbeat_fd, POLLIN, 0});
      beating.push_back(&worker);
    }
    // A replacement says that it is ready in the store, which has no descriptor to poll; a heartbeat that stands
    // still sends nothing.
    const bool awaiting = recovery_ != nullptr && (recovery_->needs_polling() || !replacements_due_.empty());
    int timeout_ms = phase_ != Phase::kRunning ? kStopPollMs
                     : awaiting              ? kReadyPollMs
                     : recovery_ != nullptr  ? kHeartbeatPollMs
                                             : -1;
    if (::poll(fds.data(), fds.size(), timeout_ms) < 0 && errno != EINTR) {
      throw Error(fmt::format("poll failed while supervising the workers: {}", std::strerror(errno)));
    }
    if (fds[0].revents != 0) handle_signals();
    if (watch_stop && fds[1].revents != 0 && phase_ == Phase::kRunning) {
      end_.kind = AttemptEnd::Kind::kStopped;
      cause_known_ = true;
      begin_stop(SIGTERM);
    }
    for (size_t i = first_stream; i < first_heartbeat; ++i) {
      if (fds[i].revents != 0) output_.read(*streams[i - first_stream]);
    }
    for (size_t i = first_heartbeat; i < fds.size(); ++i) {
      if (fds[i].revents != 0) read_heartbeat(*beating[i - first_heartbeat]);
    }
    if (recovery_ != nullptr && phase_ == Phase::kRunning) {
      kill_the_silent();
      recover_in_job();
    }
  }
  // Output still buffered in pipes held by a process that escaped the process groups is read, not waited for.
  for (Worker& worker : workers_) {
    for (OutputStream* stream : {&worker.out, &worker.err}) {
      while (stream->fd >= 0 && output_.read(*stream)) {
      }
      if (stream->fd >= 0) output_.close(*stream);
    }
  }
}

void Supervisor::handle_signals() {
  bool child_changed = false;
  signals_.drain([&](int signal) {
    if (signal == SIGCHLD) {
      child_changed = true;
    } else {
      on_launcher_signal(signal);
    }
  });
  if (child_changed) reap();
}

void Supervisor::on_launcher_signal(int signal) {
  if (interrupt_signal_ == 0) interrupt_signal_ = signal;
  if (!cause_known_) {
    end_.kind = AttemptEnd::Kind::kSignalled;
    end_.signal = interrupt_signal_;
    cause_known_ = true;
  }
  if (phase_ == Phase::kRunning) {
    begin_stop(signal);
  } else if (phase_ == Phase::kStopping) {
    // Asked twice (Ctrl-C again): no more grace.
    kill_all();
  }
}

// Reaps every exited child: the workers, and orphans of theirs that were re-parented to the launcher.
void Supervisor::reap() {
  int status = 0;
  pid_t pid;
  while ((pid = ::waitpid(-1, &status, WNOHANG)) > 0) {
    for (Worker& worker : workers_) {
      if (worker.pid == pid && worker.running) on_worker_exit(worker, status);
    }
  }
}

void Supervisor::on_worker_exit(Worker& worker, int status) {
  worker.running = false;
  if (WIFEXITED(status)) worker.exit.exit_code = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) worker.exit.signal = WTERMSIG(status);
  // Only the first failure counts: the others are usually the workers this launcher is stopping.
  if (phase_ == Phase::kRunning && !cause_known_ && worker.exit.failed()) {
    if (recovers(worker)) return;
    end_.kind = AttemptEnd::Kind::kFailed;
    end_.failure = worker.exit;
    end_.failed_log_path = worker.log_path;
    for (const Worker& other : workers_) end_.stopped_others += other.running ? 1 : 0;
    cause_known_ = true;
    begin_stop(SIGTERM);
  }
}

// Sends `signal` to every worker's process group, including groups whose leader has exited but whose
// children live on.
void Supervisor::signal_groups(int signal) {
  for (const Worker& worker : workers_) {
    if (worker.pid > 0) ::kill(-worker.pid, signal);
  }
}

void Supervisor::begin_stop(int signal) {
  signal_groups(signal);
  if (phase_ != Phase::kRunning) return;
  phase_ = Phase::kStopping;
  deadline_ = Clock::now() + grace_period_;
}

void Supervisor::kill_all() {
  signal_groups(SIGKILL);
  phase_ = Phase::kKilling;
  deadline_ = Clock::now() + kKillWait;
}

bool Supervisor::any_group_alive() const {
  for (const Worker& worker : workers_) {
    if (worker.pid > 0 && (::kill(-worker.pid, 0) == 0 || errno == EPERM)) return true;
  }
  return false;
}

}  // namespace tandem::launch
