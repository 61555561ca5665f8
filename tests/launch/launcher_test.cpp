// `tandem run` as users run it: the real program starting real workers (small shell scripts, or this test
// binary joining the rendezvous). Every run has a deadline well below the workers' `sleep 30`, so a launcher
// that fails to stop them fails the test by timing out rather than by a timing threshold. Workers write their
// pids to files, so the tests can check that none is left once tandem run has returned.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "support/listening_sockets.h"
#include "support/processes.h"
#include "support/scratch_dir.h"
#include "tandem/comm/process_group.h"
#include "tandem/launch/worker_environment.h"

namespace tandem {
namespace {

using namespace std::chrono_literals;
using testing::ProcessResult;
using testing::ScratchDir;

constexpr auto kDeadline = 20s;

ProcessResult tandem_run(const std::vector<std::string>& args, const std::map<std::string, std::string>& env = {}) {
  std::vector<std::string> argv{testing::tandem_cli(), "run"};
  argv.insert(argv.end(), args.begin(), args.end());
  return testing::run_process(argv, env, kDeadline);
}

using testing::read_file;

bool contains(const std::string& text, const std::string& needle) { return text.find(needle) != std::string::npos; }

// Asserts that every pid written to a *.pid file in `dir` names no process any more.
void expect_all_gone(const ScratchDir& dir, int expected_files) {
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path())) {
    if (entry.path().extension() != ".pid") continue;
    ++files;
    int pid = std::stoi(read_file(entry.path().string()));
    errno = 0;
    EXPECT_EQ(::kill(pid, 0), -1) << entry.path().filename() << ": process " << pid << " outlived tandem run";
    EXPECT_EQ(errno, ESRCH) << entry.path().filename();
  }
  EXPECT_EQ(files, expected_files) << "workers did not all write their pid files";
}

TEST(TandemRun, EachRankSeesItsEnvironmentAndPrefixedLines) {
  // env -u: the preset-OMP rule is tested separately, here the launcher must compute it.
  ProcessResult result = testing::run_process(
      {"env", "-u", "OMP_NUM_THREADS", testing::tandem_cli(), "run", "--nproc-per-node", "3", "--", "sh", "-c",
       "echo env $RANK/$WORLD_SIZE/$LOCAL_RANK/$LOCAL_WORLD_SIZE/$GROUP_RANK/$MASTER_ADDR/$OMP_NUM_THREADS "
       "port=$MASTER_PORT"},
      {}, kDeadline);
  ASSERT_FALSE(result.timed_out) << result.output;
  EXPECT_EQ(result.exit_code, 0) << result.output;
  const int omp = std::max(launch::usable_cpu_count() / 3, 1);
  std::set<std::string> ports;
  for (int rank = 0; rank < 3; ++rank) {
    const std::string r = std::to_string(rank);
    std::regex line("\\[" + r + "\\] env " + r + "/3/" + r + "/3/0/127\\.0\\.0\\.1/" + std::to_string(omp) +
                    " port=(\\d+)\n");
    std::smatch match;
    ASSERT_TRUE(std::regex_search(result.output, match, line)) << "rank " << rank << " in:\n" << result.output;
    ports.insert(match[1]);
  }
  EXPECT_EQ(ports.size(), 1u) << "ranks disagree on MASTER_PORT:\n" << result.output;
  EXPECT_NE(*ports.begin(), "0");
}

TEST(TandemRun, FailingRankStopsTheOthersAndGivesItsExitCode) {
  ScratchDir dir;
  // Rank 1 fails only once ranks 0 and 2 are asleep, so the launcher has something to stop.
  std::string script =
      "cd " + dir.path() + " && echo $$ > sh$RANK.pid; "
      "if [ \"$RANK\" = 1 ]; then "
      "  while [ ! -s sleep0.pid ] || [ ! -s sleep2.pid ]; do sleep 0.05; done; "
      "  echo 'rank 1 gives up' >&2; exit 7; "
      "fi; "
      "sleep 30 & echo $! > sleep$RANK.tmp; mv sleep$RANK.tmp sleep$RANK.pid; wait";
  ProcessResult result = tandem_run({"--nproc-per-node", "3", "--", "sh", "-c", script});
  ASSERT_FALSE(result.timed_out) << "tandem run did not stop the sleeping ranks:\n" << result.output;
  EXPECT_EQ(result.exit_code, 7) << result.output;
  EXPECT_TRUE(contains(result.output, "[1] rank 1 gives up\n")) << result.output;
  EXPECT_TRUE(contains(result.output, "tandem run: rank 1 exited with code 7; stopped the other 2 worker(s)\n"))
      << result.output;
  expect_all_gone(dir, 5);  // three shells and the two sleeps
}

TEST(TandemRun, RankKilledBySignalGives128PlusSignal) {
  ProcessResult result =
      tandem_run({"--nproc-per-node", "2", "--", "sh", "-c", "if [ \"$RANK\" = 1 ]; then kill -9 $$; fi; sleep 30"});
  ASSERT_FALSE(result.timed_out) << result.output;
  EXPECT_EQ(result.exit_code, 128 + SIGKILL) << result.output;
  EXPECT_TRUE(contains(result.output, "tandem run: rank 1 was killed by signal SIGKILL (9)")) << result.output;
}

TEST(TandemRun, SigtermToTheLauncherIsForwardedToEveryWorker) {
  ScratchDir dir;
  std::string script = "cd " + dir.path() +
                       " && trap 'echo got TERM; exit 3' TERM; "
                       "sleep 30 & echo $! > sleep$RANK.pid; echo $$ > sh$RANK.tmp; mv sh$RANK.tmp sh$RANK.pid; wait";
  testing::BackgroundProcess launcher(
      {testing::tandem_cli(), "run", "--nproc-per-node", "2", "--", "sh", "-c", script});
  // Wait (bounded) until both workers have set their trap and started sleeping.
  const auto give_up = std::chrono::steady_clock::now() + kDeadline;
  while (!(std::filesystem::exists(dir / "sh0.pid") && std::filesystem::exists(dir / "sh1.pid"))) {
    ASSERT_LT(std::chrono::steady_clock::now(), give_up) << "workers never started";
    std::this_thread::sleep_for(10ms);
  }
  ASSERT_EQ(::kill(launcher.pid(), SIGTERM), 0);
  ProcessResult result = launcher.finish(kDeadline);
  ASSERT_FALSE(result.timed_out) << result.output;
  EXPECT_EQ(result.exit_code, 128 + SIGTERM) << result.output;
  EXPECT_TRUE(contains(result.output, "[0] got TERM\n")) << result.output;
  EXPECT_TRUE(contains(result.output, "[1] got TERM\n")) << result.output;
  EXPECT_TRUE(contains(result.output, "tandem run: received SIGTERM")) << result.output;
  expect_all_gone(dir, 4);
}

TEST(TandemRun, RestartsGiveUpAfterMaxRestartsWithTheLastFailure) {
  ScratchDir dir;
  // Every attempt of rank 1 fails, once rank 0 of that attempt is up; each worker leaves a pid file per attempt,
  // so the attempts can be counted.
  std::string script = "cd " + dir.path() +
                       " && echo $$ > sh$RANK.$TORCHELASTIC_RESTART_COUNT.pid; "
                       "if [ \"$RANK\" = 1 ]; then "
                       "  while [ ! -s sh0.$TORCHELASTIC_RESTART_COUNT.pid ]; do sleep 0.05; done; exit 3; "
                       "fi; sleep 30";
  ProcessResult result = tandem_run({"--nproc-per-node", "2", "--max-restarts", "2", "--", "sh", "-c", script});
  ASSERT_FALSE(result.timed_out) << result.output;
  EXPECT_EQ(result.exit_code, 3) << result.output;
  for (const std::string restart : {"1", "2"}) {
    EXPECT_TRUE(contains(result.output, "tandem run: rank 1 exited with code 3; restarting all 2 worker(s) (restart " +
                                            restart + " of 2)\n"))
        << result.output;
  }
  EXPECT_TRUE(contains(result.output,
                       "tandem run: rank 1 exited with code 3; stopped the other 1 worker(s); all 2 restart(s) used up\n"))
      << result.output;
  expect_all_gone(dir, 6);  // two workers in each of three attempts
}

TEST(TandemRun, SigtermToTheLauncherDoesNotRestart) {
  ScratchDir dir;
  // The workers exit 3 on SIGTERM: a failure, had it not come from the launcher being stopped.
  std::string script = "cd " + dir.path() +
                       " && trap 'exit 3' TERM; "
                       "sleep 30 & echo $! > sleep$RANK.$TORCHELASTIC_RESTART_COUNT.pid; "
                       "echo $$ > sh$RANK.tmp; mv sh$RANK.tmp sh$RANK.$TORCHELASTIC_RESTART_COUNT.pid; wait";
  testing::BackgroundProcess launcher(
      {testing::tandem_cli(), "run", "--nproc-per-node", "2", "--max-restarts", "3", "--", "sh", "-c", script});
  const auto give_up = std::chrono::steady_clock::now() + kDeadline;
  while (!(std::filesystem::exists(dir / "sh0.0.pid") && std::filesystem::exists(dir / "sh1.0.pid"))) {
    ASSERT_LT(std::chrono::steady_clock::now(), give_up) << "workers never started";
    std::this_thread::sleep_for(10ms);
  }
  ASSERT_EQ(::kill(launcher.pid(), SIGTERM), 0);
  ProcessResult result = launcher.finish(kDeadline);
  ASSERT_FALSE(result.timed_out) << result.output;
  EXPECT_EQ(result.exit_code, 128 + SIGTERM) << result.output;
  EXPECT_FALSE(contains(result.output, "restarting")) << result.output;
  EXPECT_TRUE(contains(result.output, "tandem run: received SIGTERM")) << result.output;
  expect_all_gone(dir, 4);  // one attempt only: two shells and their sleeps
}

TEST(TandemRun, AcceptsTorchrunSpellings) {
  const std::string port = std::to_string(testing::free_port());
  ProcessResult result = tandem_run({"--nproc_per_node", "2", "--nnodes", "1", "--node_rank", "0", "--master_addr",
                                     "127.0.0.1", "--master_port", port, "--", "sh", "-c",
                                     "echo $RANK/$WORLD_SIZE@$MASTER_ADDR:$MASTER_PORT"});
  ASSERT_FALSE(result.timed_out) << result.output;
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_TRUE(contains(result.output, "[0] 0/2@127.0.0.1:" + port + "\n")) << result.output;
  EXPECT_TRUE(contains(result.output, "[1] 1/2@127.0.0.1:" + port + "\n")) << result.output;
}

TEST(TandemRun, KeepsAPresetOmpNumThreads) {
  ProcessResult result =
      tandem_run({"--nproc-per-node", "2", "--", "sh", "-c", "echo omp=$OMP_NUM_THREADS"}, {{"OMP_NUM_THREADS", "3"}});
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_TRUE(contains(result.output, "[0] omp=3\n")) << result.output;
  EXPECT_TRUE(contains(result.output, "[1] omp=3\n")) << result.output;
}

TEST(TandemRun, LogDirHoldsEachRanksLines) {
  ScratchDir dir;
  const std::string logs = dir / "logs";
  // The last line has no newline: it must still arrive, whole, when the worker exits.
  ProcessResult result = tandem_run({"--nproc-per-node", "2", "--log-dir", logs, "--", "sh", "-c",
                                     "echo out $RANK; echo err $RANK >&2; printf 'tail %s' $RANK"});
  ASSERT_FALSE(result.timed_out) << result.output;
  EXPECT_EQ(result.exit_code, 0) << result.output;
  for (int rank = 0; rank < 2; ++rank) {
    const std::string r = std::to_string(rank);
    std::string log = read_file(logs + "/rank" + r + ".log");
    for (const std::string line : {"out", "err", "tail"}) {
      EXPECT_TRUE(contains(log, line + " " + r + "\n")) << "rank" << rank << ".log:\n" << log;
      EXPECT_TRUE(contains(result.output, "[" + r + "] " + line + " " + r + "\n")) << result.output;
    }
    EXPECT_FALSE(contains(log, "out " + std::to_string(1 - rank))) << "rank" << rank << ".log:\n" << log;
  }
}

// A log file on a full disk (here /dev/full, which refuses every write with ENOSPC) loses the rank's lines: the
// launcher says so once, naming the file, and the run goes on with every line on the terminal.
TEST(TandemRun, ALogFileOnAFullDiskIsOneLineAndTheLinesStillReachTheTerminal) {
  ScratchDir dir;
  const std::string logs = dir / "logs";
  std::filesystem::create_directories(logs);
  std::filesystem::create_symlink("/dev/full", logs + "/rank1.log");
  ProcessResult result =
      tandem_run({"--nproc-per-node", "2", "--log-dir", logs, "--", "sh", "-c", "echo one $RANK; echo two $RANK"});
  ASSERT_FALSE(result.timed_out) << result.output;
  EXPECT_EQ(result.exit_code, 0) << result.output;
  const std::string refusal = "tandem run: cannot write rank 1's log file '" + logs +
                              "/rank1.log' (No space left on device); its later lines reach only the terminal; free "
                              "space on that disk, or log to another folder\n";
  EXPECT_TRUE(contains(result.output, refusal)) << result.output;
  EXPECT_EQ(result.output.find("cannot write"), result.output.rfind("cannot write")) << "said more than once:\n"
                                                                                      << result.output;
  for (const std::string line : {"one", "two"}) {
    for (const std::string rank : {"0", "1"}) {
      EXPECT_TRUE(contains(result.output, "[" + rank + "] " + line + " " + rank + "\n")) << result.output;
    }
    EXPECT_TRUE(contains(read_file(logs + "/rank0.log"), line + " 0\n"));
  }
}

TEST(TandemRun, FailureLineNamesTheLogFile) {
  ScratchDir dir;
  ProcessResult result = tandem_run(
      {"--nproc-per-node", "2", "--log-dir", dir.path(), "--", "sh", "-c", "[ \"$RANK\" = 0 ] || exit 4; sleep 30"});
  ASSERT_FALSE(result.timed_out) << result.output;
  EXPECT_EQ(result.exit_code, 4) << result.output;
  EXPECT_TRUE(contains(result.output, "rank 1 exited with code 4 (log: " + dir.path() + "/rank1.log)"))
      << result.output;
}

TEST(TandemRun, MissingCommandExits127) {
  ProcessResult result = tandem_run({"--nproc-per-node", "2", "--", "tandem-no-such-command", "x"});
  ASSERT_FALSE(result.timed_out) << result.output;
  EXPECT_EQ(result.exit_code, 127) << result.output;
  EXPECT_EQ(result.output,
            "tandem run: cannot execute 'tandem-no-such-command' for rank 0: No such file or directory (not found in "
            "PATH)\n");
}

TEST(TandemRun, BadCommandLinesGiveOneLineAndFail) {
  struct Case {
    std::vector<std::string> args;
    std::string needle;
  };
  for (const Case& c : {Case{{"--nproc-per-node", "x", "--", "true"}, "--nproc-per-node"},
                        Case{{"--frobnicate", "--", "true"}, "--frobnicate"},
                        Case{{"--nproc-per-node", "2"}, "no command to run"},
                        Case{{"--nproc-per-node", "2", "true"}, "put the command after `--`"},
                        Case{{"--gpus", "2,7", "--nproc-per-node", "3", "--", "true"}, "2 GPU(s) listed in --gpus"}}) {
    ProcessResult result = tandem_run(c.args);
    ASSERT_FALSE(result.timed_out) << result.output;
    EXPECT_NE(result.exit_code, 0) << result.output;
    EXPECT_TRUE(contains(result.output, c.needle)) << result.output;
    EXPECT_EQ(std::count(result.output.begin(), result.output.end(), '\n'), 1) << result.output;
  }
}

// The rendezvous of a single-node run, seen from its ranks (this binary, started by `tandem run`).

InitOptions worker_init_options() {
  InitOptions options;
  options.backend = "gloo";
  options.timeout = std::chrono::seconds(15);
  return options;
}

int master_port() { return std::stoi(std::getenv("MASTER_PORT")); }

// Joins, then prints every socket that listens on MASTER_PORT or is held by this rank or by its launcher (its
// parent), as "listening ADDRESS:PORT loopback|EXPOSED", then "looked". The barrier keeps every rank's store
// and communicator up until all have looked.
TEST(ListeningSocketsWorker, Run) {
  if (!testing::is_worker_process()) GTEST_SKIP() << "a rank of TandemRun.SingleNodeRunListensOnLoopbackOnly";
  init_process_group(worker_init_options());
  std::set<unsigned long> ours = testing::open_socket_inodes(::getpid());
  std::set<unsigned long> launchers = testing::open_socket_inodes(::getppid());
  ours.insert(launchers.begin(), launchers.end());
  for (const testing::ListeningSocket& socket : testing::listening_sockets()) {
    if (socket.port != master_port() && ours.count(socket.inode) == 0) continue;
    std::cout << "listening " << socket.describe() << (socket.loopback ? " loopback" : " EXPOSED") << std::endl;
  }
  std::cout << "looked" << std::endl;
  barrier();
  destroy_process_group();
}

TEST(TandemRun, SingleNodeRunListensOnLoopbackOnly) {
  ProcessResult result =
      testing::run_launched_worker_ranks({"--nproc-per-node", "2"}, "ListeningSocketsWorker.Run", kDeadline);
  ASSERT_FALSE(result.timed_out) << result.output;
  EXPECT_EQ(result.exit_code, 0) << result.output;
  for (const std::string rank : {"0", "1"}) {
    EXPECT_TRUE(contains(result.output, "[" + rank + "] looked\n")) << result.output;
  }
  std::regex listening("\\[(\\d)\\] listening (\\S+) (loopback|EXPOSED)\n");
  for (std::sregex_iterator it(result.output.begin(), result.output.end(), listening), end; it != end; ++it) {
    EXPECT_EQ((*it)[3], "loopback") << "rank " << (*it)[1] << " sees " << (*it)[2]
                                    << " listening beyond this machine:\n"
                                    << result.output;
  }
}

// Before joining, takes MASTER_PORT on 127.0.0.1 as another job would that was handed the same port in the gap
// after the launcher chose it, and keeps it while joining.
TEST(PortTakerWorker, Run) {
  if (!testing::is_worker_process()) GTEST_SKIP() << "a rank of TandemRun.RendezvousPortCannotBeTakenFromARun";
  testing::HeldPort taker(master_port());
  // Where the launcher serves the store on MASTER_PORT (torchrun's agent store), it has held the port since it
  // chose it. Elsewhere the ranks must not depend on the port staying free.
  const char* agent_store = std::getenv("TORCHELASTIC_USE_AGENT_STORE");
  if (agent_store != nullptr && std::string(agent_store) == "True") {
    EXPECT_FALSE(taker.held()) << "took port " << master_port() << " from under the launcher's store";
  }
  init_process_group(worker_init_options());
  barrier();
  destroy_process_group();
  std::cout << "joined" << std::endl;
}

TEST(TandemRun, RendezvousPortCannotBeTakenFromARun) {
  ProcessResult result =
      testing::run_launched_worker_ranks({"--nproc-per-node", "2"}, "PortTakerWorker.Run", kDeadline);
  ASSERT_FALSE(result.timed_out) << result.output;
  EXPECT_EQ(result.exit_code, 0) << result.output;
  for (const std::string rank : {"0", "1"}) {
    EXPECT_TRUE(contains(result.output, "[" + rank + "] joined\n")) << result.output;
  }
}

// Joins, and in the first attempt rank 1 fails once both have joined, so the store holds that attempt's keys.
// A restarted rank that met those keys would be refused as a second claimant of its rank.
TEST(RestartedWorker, Run) {
  if (!testing::is_worker_process()) GTEST_SKIP() << "a rank of TandemRun.FailedWorkerRestartsTheGroupWhichJoinsAfresh";
  const int restart = std::stoi(std::getenv("TORCHELASTIC_RESTART_COUNT"));
  init_process_group(worker_init_options());
  barrier();
  std::cout << "attempt " << restart << " of " << std::getenv("TORCHELASTIC_MAX_RESTARTS") << " joined" << std::endl;
  if (restart == 0 && rank() == 1) std::_Exit(5);
  barrier();
  destroy_process_group();
}

TEST(TandemRun, FailedWorkerRestartsTheGroupWhichJoinsAfresh) {
  ProcessResult result = testing::run_launched_worker_ranks({"--nproc-per-node", "2", "--max-restarts", "1"},
                                                            "RestartedWorker.Run", kDeadline);
  ASSERT_FALSE(result.timed_out) << result.output;
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_TRUE(contains(result.output, "tandem run: rank 1 exited with code 5; restarting all 2 worker(s) (restart 1 "
                                      "of 1)\n"))
      << result.output;
  for (const std::string rank : {"0", "1"}) {
    EXPECT_TRUE(contains(result.output, "[" + rank + "] attempt 1 of 1 joined\n")) << result.output;
  }
}

TEST(TandemRun, BusyMasterPortOnOneNodeIsOneLineNamingIt) {
  testing::HeldPort busy;
  const std::string port = std::to_string(busy.port());
  ProcessResult result = tandem_run({"--nproc-per-node", "2", "--master-port", port, "--", "true"});
  ASSERT_FALSE(result.timed_out) << result.output;
  EXPECT_NE(result.exit_code, 0) << result.output;
  EXPECT_TRUE(contains(result.output, "--master-port " + port)) << result.output;
  EXPECT_EQ(std::count(result.output.begin(), result.output.end(), '\n'), 1) << result.output;
}

}  // namespace
}  // namespace tandem
