#include "tandem/launch/launcher.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <vector>

#include "output_relay.h"
#include "signal_relay.h"
#include "tandem/launch/local_store.h"
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

void report(const std::string& message) { write_all(STDERR_FILENO, "tandem run: " + message + "\n"); }

struct Worker {
  int local_rank = 0;
  pid_t pid = -1;  // also the id of the worker's process group
  bool running = false;
  WorkerExit exit;
  OutputStream out;
  OutputStream err;
  int log_fd = -1;
  std::string log_path;
};

class Supervisor {
 public:
  // `store`: the rendezvous store the launcher serves to the workers; null where rank 0 serves it.
  Supervisor(const LaunchPlan& plan, const LocalStore* store) : plan_(plan), store_(store) {}
  ~Supervisor() {
    for (Worker& worker : workers_) {
      for (int fd : {worker.out.fd, worker.err.fd, worker.log_fd}) {
        if (fd >= 0) ::close(fd);
      }
    }
  }

  int run() {
    open_logs();
    for (int restart = 0;; ++restart) {
      start_workers(restart);
      supervise();
      if (!restart_due(restart)) return finish(restart);
      report(fmt::format("rank {} {}; restarting all {} worker(s) (restart {} of {})", failure_->rank,
                         failure_->describe(), workers_.size(), restart + 1, plan_.max_restarts));
      forget_attempt();
    }
  }

 private:
  void open_logs() {
    workers_.resize(static_cast<size_t>(plan_.nproc_per_node));
    if (!plan_.log_dir.empty()) {
      std::error_code error;
      std::filesystem::create_directories(plan_.log_dir, error);
      if (error) {
        throw InvalidArgument(fmt::format("`log_dir` '{}' cannot be created ({}); give a folder that tandem run can "
                                          "create and write in",
                                          plan_.log_dir, error.message()));
      }
    }
    for (int local = 0; local < plan_.nproc_per_node; ++local) {
      Worker& worker = workers_[static_cast<size_t>(local)];
      worker.local_rank = local;
      worker.exit.rank = plan_.global_rank(local);
      worker.log_path = plan_.log_path(local);
      if (worker.log_path.empty()) continue;
      worker.log_fd = ::open(worker.log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (worker.log_fd < 0) {
        throw InvalidArgument(fmt::format("cannot write the log file '{}' in `log_dir` ({}); give a folder that "
                                          "tandem run can write in",
                                          worker.log_path, std::strerror(errno)));
      }
    }
  }

  std::vector<std::string> environment_for(int local_rank, int restart,
                                           const std::map<std::string, std::string>& store_variables) const {
    auto overrides =
        worker_environment(plan_, local_rank, restart, comm::process_environment(), usable_cpu_count());
    overrides.insert(store_variables.begin(), store_variables.end());
    // The workers write into pipes; rank 0's progress bar needs to know that the launcher shows them on a
    // terminal, which redraws a line in place (see OutputRelay::emit).
    if (::isatty(STDERR_FILENO) == 1) overrides["TANDEM_TERMINAL"] = "1";
    return environment_with(overrides);
  }

  void start_workers(int restart) {
    // Orphans of the workers (a shell's children, say) are re-parented to the launcher, so it can reap them
    // and know when a worker's whole process group is gone.
    ::prctl(PR_SET_CHILD_SUBREAPER, 1);
    const auto store_variables =
        store_ != nullptr ? store_->worker_variables(restart) : std::map<std::string, std::string>{};
    for (Worker& worker : workers_) {
      WorkerProcess process = spawn_worker(plan_.command, environment_for(worker.local_rank, restart, store_variables),
                                           worker.exit.rank);
      if (process.exec_errno == 0) {
        worker.pid = process.pid;
        worker.running = true;
        worker.out = OutputStream::from_pipe(process.stdout_fd, worker.exit.rank, STDOUT_FILENO, worker.log_fd);
        worker.err = OutputStream::from_pipe(process.stderr_fd, worker.exit.rank, STDERR_FILENO, worker.log_fd);
        continue;
      }
      exec_failure_code_ = process.exec_errno == ENOENT ? 127 : 126;
      exec_failure_ = exec_failure_message(plan_.command.front(), worker.exit.rank, process.exec_errno);
      begin_stop(SIGTERM);
      return;
    }
  }

  void supervise() {
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
      std::vector<OutputStream*> streams;
      for (Worker& worker : workers_) {
        for (OutputStream* stream : {&worker.out, &worker.err}) {
          if (stream->fd < 0) continue;
          fds.push_back({stream->fd, POLLIN, 0});
          streams.push_back(stream);
        }
      }
      int timeout_ms = phase_ == Phase::kRunning ? -1 : kStopPollMs;
      if (::poll(fds.data(), fds.size(), timeout_ms) < 0 && errno != EINTR) {
        throw Error(fmt::format("poll failed while supervising the workers: {}", std::strerror(errno)));
      }
      if (fds[0].revents != 0) handle_signals();
      for (size_t i = 1; i < fds.size(); ++i) {
        if (fds[i].revents != 0) output_.read(*streams[i - 1]);
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

  // After a worker failed, and only then, the group starts again while restarts are left; a signal to the
  // launcher, even one that came while it was stopping the failed group, means stop for good.
  bool restart_due(int restart) {
    handle_signals();
    return failure_ && interrupt_signal_ == 0 && exec_failure_.empty() && restart < plan_.max_restarts;
  }

  // Makes the workers ready to be started again; their log files stay open and receive the next attempt too.
  void forget_attempt() {
    for (Worker& worker : workers_) {
      worker.pid = -1;
      worker.running = false;
      worker.exit = WorkerExit{worker.exit.rank};
      worker.out = {};
      worker.err = {};
    }
    phase_ = Phase::kRunning;
    failure_.reset();
    stopped_others_ = 0;
  }

  int finish(int restart) {
    if (!exec_failure_.empty()) {
      report(exec_failure_);
      return exec_failure_code_;
    }
    if (failure_) {
      const Worker& failed = workers_[failed_worker_];
      std::string log = failed.log_path.empty() ? "" : fmt::format(" (log: {})", failed.log_path);
      std::string used_up = plan_.max_restarts > 0 && restart == plan_.max_restarts
                                ? fmt::format("; all {} restart(s) used up", plan_.max_restarts)
                                : "";
      report(fmt::format("rank {} {}{}; stopped the other {} worker(s){}", failure_->rank, failure_->describe(), log,
                         stopped_others_, used_up));
      return failure_->shell_code();
    }
    if (interrupt_signal_ != 0) {
      report(fmt::format("received {}; forwarded it to the {} worker(s) and stopped them",
                         signal_name(interrupt_signal_), workers_.size()));
      return 128 + interrupt_signal_;
    }
    return 0;
  }

  void handle_signals() {
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

  void on_launcher_signal(int signal) {
    if (interrupt_signal_ == 0) interrupt_signal_ = signal;
    if (phase_ == Phase::kRunning) {
      begin_stop(signal);
    } else if (phase_ == Phase::kStopping) {
      // Asked twice (Ctrl-C again): no more grace.
      kill_all();
    }
  }

  // Reaps every exited child: the workers, and orphans of theirs that were re-parented to the launcher.
  void reap() {
    int status = 0;
    pid_t pid;
    while ((pid = ::waitpid(-1, &status, WNOHANG)) > 0) {
      for (Worker& worker : workers_) {
        if (worker.pid == pid && worker.running) on_worker_exit(worker, status);
      }
    }
  }

  void on_worker_exit(Worker& worker, int status) {
    worker.running = false;
    if (WIFEXITED(status)) worker.exit.exit_code = WEXITSTATUS(status);
    if (WIFSIGNALED(status)) worker.exit.signal = WTERMSIG(status);
    // Only the first failure counts: the others are usually the workers this launcher is stopping.
    if (phase_ == Phase::kRunning && worker.exit.failed()) {
      failure_ = worker.exit;
      failed_worker_ = static_cast<size_t>(worker.local_rank);
      for (const Worker& other : workers_) stopped_others_ += other.running ? 1 : 0;
      begin_stop(SIGTERM);
    }
  }

  // Sends `signal` to every worker's process group, including groups whose leader has exited but whose
  // children live on.
  void signal_groups(int signal) {
    for (const Worker& worker : workers_) {
      if (worker.pid > 0) ::kill(-worker.pid, signal);
    }
  }

  void begin_stop(int signal) {
    signal_groups(signal);
    if (phase_ != Phase::kRunning) return;
    phase_ = Phase::kStopping;
    deadline_ = Clock::now() + plan_.grace_period;
  }

  void kill_all() {
    signal_groups(SIGKILL);
    phase_ = Phase::kKilling;
    deadline_ = Clock::now() + kKillWait;
  }

  bool any_group_alive() const {
    for (const Worker& worker : workers_) {
      if (worker.pid > 0 && (::kill(-worker.pid, 0) == 0 || errno == EPERM)) return true;
    }
    return false;
  }

  enum class Phase { kRunning, kStopping, kKilling };

  const LaunchPlan& plan_;
  const LocalStore* store_;
  SignalRelay signals_;
  OutputRelay output_;
  std::vector<Worker> workers_;
  Phase phase_ = Phase::kRunning;
  Clock::time_point deadline_;
  std::optional<WorkerExit> failure_;
  size_t failed_worker_ = 0;
  int stopped_others_ = 0;
  int interrupt_signal_ = 0;
  std::string exec_failure_;
  int exec_failure_code_ = 0;
};

// On several nodes every worker connects to the master by name. One that no name server knows would leave each
// worker retrying it until its own timeout (tandem train's: 300 s), with a LibTorch warning every second; a
// lookup that fails for the moment (EAI_AGAIN) may yet succeed, and is left to the workers.
void check_master_resolves(const std::string& host) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int error = ::getaddrinfo(host.c_str(), nullptr, &hints, &found);
  if (found != nullptr) ::freeaddrinfo(found);
  if (error == EAI_NONAME) {
    throw InvalidArgument(fmt::format("`master_addr` {} names no host that this node can find ({}); give node 0's "
                                      "address, or a host name that every node resolves",
                                      host, ::gai_strerror(error)));
  }
}

}  // namespace

int launch(const LaunchPlan& plan) {
  if (plan.nnodes > 1) {
    check_master_resolves(plan.master_addr);
    Supervisor supervisor(plan, nullptr);
    return supervisor.run();
  }
  // One node: the launcher serves the rendezvous store, on loopback, until every worker is gone.
  LocalStore store(plan.master_addr, plan.master_port);
  LaunchPlan local = plan;
  local.master_port = store.port();
  Supervisor supervisor(local, &store);
  return supervisor.run();
}

}  // namespace tandem::launch
