#pragma once
// One attempt of a node's workers, from start to the last process gone (docs/launcher.md, "Who kills whom"):
// the Supervisor starts plan.nproc_per_node workers, relays their output, and stops them all (SIGTERM, then
// SIGKILL after the grace period) when the first one fails, when the launcher is signalled, or when the caller
// asks from outside (the elastic agent, whose membership changed). What to do next (restart, give up, form a new
// round) is the caller's: launcher.cpp's restart loop on one node or a static job, elastic_agent.cpp's rounds.
//
// Private to the launcher. One Supervisor at a time per process: it owns the signal relay (signal_relay.h).
#include <sys/types.h>

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "in_job_recovery.h"
#include "output_relay.h"
#include "signal_relay.h"
#include "tandem/launch/launch_options.h"
#include "tandem/launch/worker_exit.h"

namespace tandem::launch {

// How an attempt ended, first cause first: a later failure while stopping is the stopping, not a cause.
struct AttemptEnd {
  enum class Kind {
    kSucceeded,  // every worker exited 0
    kFailed,     // a worker failed: `failure`
    kSignalled,  // the launcher got `signal` (SIGINT, SIGTERM, SIGHUP)
    kNotRun,     // the command cannot be executed: `exec_failure`, `exec_failure_code`
    kStopped,    // stopped from outside (stop_fd)
  };
  Kind kind = Kind::kSucceeded;
  WorkerExit failure;
  std::string failed_log_path;  // the failed rank's log file, or empty
  int stopped_others = 0;       // workers still running when the failure came
  int workers = 0;
  int signal = 0;
  std::string exec_failure;
  int exec_failure_code = 0;
};

// "rank 1 exited with code 7 (log: DIR/rank1.log); stopped the other 2 worker(s)" and such: the line (without
// "tandem run: ") for an attempt that ends the run, and the exit code for it.
std::string describe_end(const AttemptEnd& end);
int exit_code_of(const AttemptEnd& end);

class Supervisor {
 public:
  explicit Supervisor(std::chrono::milliseconds grace_period) : grace_period_(grace_period) {}
  ~Supervisor();
  Supervisor(const Supervisor&) = delete;
  Supervisor& operator=(const Supervisor&) = delete;

  // Starts the workers of `plan` as attempt `restart_count` (TORCHELASTIC_RESTART_COUNT), each with the
  // worker_environment of the plan plus `store_variables`, and blocks until every worker's process group is
  // empty. `stop_fd` (or -1): when it becomes readable while the workers run, they are stopped and the attempt
  // ends kStopped, unless a failure or a signal came first. Log files (plan.log_dir) are truncated when this
  // Supervisor first opens them and receive every later attempt. Throws InvalidArgument when the log directory
  // cannot be written; no worker has started then.
  //
  // `recovery` (or null): under in-job recovery, a failed worker that it recovers stops nobody; its replacement
  // starts in its place when `recovery` allows one, with the same variables and TANDEM_RECOVERY_REPLACEMENT=1.
  // A replacement that the members ended the run without ends by itself (comm::Membership::close).
  AttemptEnd run_attempt(const LaunchPlan& plan, int restart_count,
                         const std::map<std::string, std::string>& store_variables, int stop_fd = -1,
                         InJobRecovery* recovery = nullptr);

  // Between attempts: waits up to `wait` for a signal to the launcher and returns it (0 if none came), reaping
  // children meanwhile. Where an attempt already ended kSignalled, returns that signal at once.
  int wait_for_signal(std::chrono::milliseconds wait);
  // The first SIGINT, SIGTERM or SIGHUP the launcher got, 0 if none: after one, nothing is started again, even
  // when it came while a failed attempt was being stopped (which still ends kFailed).
  int signal_received() const { return interrupt_signal_; }

 private:
  struct Worker {
    int local_rank = 0;
    pid_t pid = -1;  // also the id of the worker's process group
    bool running = false;
    WorkerExit exit;
    OutputStream out;
    OutputStream err;
    int log_fd = -1;  // owned by log_fds_
    std::string log_path;
    bool awaiting = false;  // a replacement not yet taken in (in-job recovery)
    // In-job recovery: the read end of its heartbeat pipe, and when a beat last came (none yet: not watched).
    int heartbeat_fd = -1;
    std::optional<std::chrono::steady_clock::time_point> beaten;
  };
  enum class Phase { kRunning, kStopping, kKilling };

  int log_fd(const std::string& path);
  std::vector<std::string> environment_for(const LaunchPlan& plan, int local_rank, int restart,
                                           const std::map<std::string, std::string>& store_variables) const;
  void start_workers(const LaunchPlan& plan, int restart, const std::map<std::string, std::string>& store_variables);
  // Starts `worker`'s process; false (and the attempt ends kNotRun) when the command cannot be executed.
  bool start_worker(Worker& worker, const std::vector<std::string>& environment, const std::string& program);
  // In-job recovery, between two polls: replacements due are started, and those that are ready taken in.
  void recover_in_job();
  void read_heartbeat(Worker& worker);
  void kill_the_silent();
  bool recovers(const Worker& worker);
  void supervise(int stop_fd);
  void handle_signals();
  void on_launcher_signal(int signal);
  void reap();
  void on_worker_exit(Worker& worker, int status);
  void signal_groups(int signal);
  void begin_stop(int signal);
  void kill_all();
  bool any_group_alive() const;

  std::chrono::milliseconds grace_period_;
  SignalRelay signals_;
  OutputRelay output_;
  std::map<std::string, int> log_fds_;  // path -> open file, across attempts
  std::vector<Worker> workers_;  // a replacement is appended; its lost worker's entry stays, exited
  // The current attempt's, for the replacements that in-job recovery starts during it.
  const LaunchPlan* plan_ = nullptr;
  int restart_ = 0;
  const std::map<std::string, std::string>* store_variables_ = nullptr;
  InJobRecovery* recovery_ = nullptr;
  std::vector<int> replacements_due_;  // local ranks
  Phase phase_ = Phase::kRunning;
  std::chrono::steady_clock::time_point deadline_;
  AttemptEnd end_;
  bool cause_known_ = false;  // end_.kind holds the attempt's first cause
  int interrupt_signal_ = 0;  // sticky across attempts: a signalled launcher starts nothing more
};

}  // namespace tandem::launch
