#pragma once
// The real-process test tier: runs programs (the `tandem` binary, or this test binary re-entered as a rank
// worker) with a deadline, so that a hang fails the test instead of stalling CI.
#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace tandem::testing {

struct ProcessResult {
  int exit_code = -1;   // valid when the process exited normally
  int term_signal = 0;  // non-zero when a signal ended it
  bool timed_out = false;
  std::string output;   // stdout and stderr, interleaved
};

// Runs argv with extra environment variables, in its own process group; at the deadline the whole group is
// killed and timed_out is set.
ProcessResult run_process(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env = {},
                          std::chrono::milliseconds deadline = std::chrono::seconds(60));

// A process started without waiting for it, for tests that act on it while it runs (signal it, say). Its
// output is read only once finish() is called, so it must print less than a pipe holds (64 KiB) before then.
class BackgroundProcess {
 public:
  explicit BackgroundProcess(const std::vector<std::string>& argv,
                             const std::map<std::string, std::string>& env = {});
  // Kills the process group if finish() was not called, so a failed assertion leaves nothing running.
  ~BackgroundProcess();
  BackgroundProcess(const BackgroundProcess&) = delete;
  BackgroundProcess& operator=(const BackgroundProcess&) = delete;

  int pid() const { return pid_; }
  // Waits like run_process: at the deadline the whole group is killed and timed_out is set.
  ProcessResult finish(std::chrono::milliseconds deadline = std::chrono::seconds(60));

 private:
  int pid_ = -1;
  int output_fd_ = -1;
  bool finished_ = false;
};

// Kills every process of `hosts` still running (a test's agents, one per host) and returns what each printed,
// "host N:" before each, for a failure's message.
std::string kill_all_and_collect(std::map<int, std::unique_ptr<BackgroundProcess>>& hosts,
                                 std::chrono::milliseconds deadline);

// Starts world_size copies of this test binary, each running only the test named `worker_test`
// ("Suite.Name") with RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR=127.0.0.1, a free MASTER_PORT and
// TANDEM_TEST_WORKER=1 set, and waits for all of them until the deadline.
std::vector<ProcessResult> run_worker_ranks(int world_size, const std::string& worker_test,
                                            std::chrono::milliseconds deadline = std::chrono::seconds(120),
                                            const std::map<std::string, std::string>& env = {});

// Runs `tandem run LAUNCHER_ARGS -- THIS_TEST_BINARY --gtest_filter=worker_test`, so that the launcher sets up the
// ranks as it does for users; the workers get TANDEM_TEST_WORKER=1 and OMP_NUM_THREADS=1. Returns the
// launcher's result, whose output holds every rank's lines prefixed "[rank] ".
ProcessResult run_launched_worker_ranks(const std::vector<std::string>& launcher_args, const std::string& worker_test,
                                        std::chrono::milliseconds deadline = std::chrono::seconds(120),
                                        const std::map<std::string, std::string>& env = {});

// Starts world_size ranks of this test binary through Open MPI's `mpirun` (allowed to run as root and to
// oversubscribe the cores, as in CI containers), each running only `worker_test` with TANDEM_TEST_WORKER=1
// and OMP_NUM_THREADS=1; returns mpirun's result, whose output holds every rank's.
ProcessResult run_mpirun_ranks(int world_size, const std::string& worker_test,
                               std::chrono::milliseconds deadline = std::chrono::seconds(120),
                               const std::map<std::string, std::string>& env = {});

// Runs only `worker_test` of this test binary in one child process with TANDEM_TEST_WORKER=1.
ProcessResult run_worker_process(const std::string& worker_test, const std::map<std::string, std::string>& env = {},
                                 std::chrono::milliseconds deadline = std::chrono::seconds(60));

// True inside a process started by run_worker_ranks; worker tests skip themselves otherwise.
bool is_worker_process();

// A TCP port on 127.0.0.1 that was free a moment ago.
int free_port();

// The `tandem` program built with these tests.
std::string tandem_cli();

}  // namespace tandem::testing
