#include "bench/recovery/recovery_bench.h"

#include <fmt/format.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "bench/harness/child_processes.h"
#include "tandem/util/error.h"

namespace tandem::bench {
namespace {

using Clock = std::chrono::steady_clock;

// A job that runs past this is stuck: the driver kills it and says so.
constexpr std::chrono::seconds kJobDeadline{600};
// How often the driver reads steps.jsonl while it waits for the kill's step.
constexpr std::chrono::milliseconds kPoll{2};

double unix_time() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// rank 0's step records so far; a line still being written is left for the next read.
std::vector<nlohmann::json> read_steps(const std::filesystem::path& path) {
  std::vector<nlohmann::json> steps;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (in.eof()) break;  // no newline yet
    steps.push_back(nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false));
    if (steps.back().is_discarded()) steps.pop_back();
  }
  return steps;
}

int64_t newest_step(const std::vector<nlohmann::json>& steps) {
  int64_t newest = 0;
  for (const auto& step : steps) newest = std::max(newest, step.value("step", int64_t{0}));
  return newest;
}

int read_pid(const std::filesystem::path& path) {
  std::ifstream in(path);
  int pid = 0;
  in >> pid;
  return pid;
}

// Starts `command` through the shell in a process group of its own; its output goes to `log`.
pid_t start_job(const std::string& command, const std::filesystem::path& log) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setpgid(0, 0);
    const std::string redirected = command + " >" + shell_quoted(log.string()) + " 2>&1";
    ::execl("/bin/sh", "sh", "-c", redirected.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  if (pid < 0) throw CommError("cannot start a job for the recovery benchmark (fork failed)");
  return pid;
}

// Waits for the job until the deadline; kills its process group then. Returns its exit status, -1 when it ran past
// the deadline.
int wait_for_job(pid_t pid, Clock::time_point deadline) {
  while (Clock::now() < deadline) {
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ::kill(-pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
  return -1;
}

RecoveryRun run_once(const RecoveryBenchOptions& options, int ranks, const std::string& recovery, int round,
                     const ResultFolder& folder) {
  const std::string name = fmt::format("{}_{}_{}", recovery, ranks, round);
  const std::filesystem::path cwd = folder / name;
  std::filesystem::create_directories(cwd);
  const std::string worker =
      fmt::format("echo $$ > pid.$RANK && exec {} train --data {} --model {} --batch-size {} --steps {} --epochs 1000 "
                  "--checkpoint-every {} --threads 1 --run-dir run --no-tensorboard --no-report",
                  shell_quoted(options.program), shell_quoted(options.data_dir), options.model, options.batch_size,
                  options.steps, options.checkpoint_every);
  const std::string command =
      fmt::format("cd {} && exec {} run --nproc-per-node {} --max-restarts 1 --recovery {} -- sh -c {}",
                  shell_quoted(cwd.string()), shell_quoted(options.program), ranks, recovery, shell_quoted(worker));
  const pid_t job = start_job(command, cwd / "output.log");
  const auto deadline = Clock::now() + kJobDeadline;
  const std::filesystem::path steps_path = cwd / "run" / "steps.jsonl";

  RecoveryRun run{ranks, recovery, round};
  double kill_time = 0;
  while (Clock::now() < deadline) {
    int status = 0;
    if (::waitpid(job, &status, WNOHANG) == job) {
      throw CommError(fmt::format("the {} job ended before step {}; see {}", name, options.kill_after,
                                  (cwd / "output.log").string()));
    }
    if (newest_step(read_steps(steps_path)) >= options.kill_after) {
      const int victim = read_pid(cwd / "pid.1");
      kill_time = unix_time();
      ::kill(victim, SIGKILL);
      run.last_step_before_kill = newest_step(read_steps(steps_path));
      break;
    }
    std::this_thread::sleep_for(kPoll);
  }
  const int code = wait_for_job(job, deadline);
  if (code != 0) {
    throw CommError(fmt::format("the {} job {}; see {}", name,
                                code < 0 ? "ran past its deadline" : fmt::format("exited with code {}", code),
                                (cwd / "output.log").string()));
  }
  // The newest record of each step: a restarted attempt replaces the records of the steps it trains again.
  std::map<int64_t, nlohmann::json> by_step;
  for (const auto& step : read_steps(steps_path)) by_step[step.at("step").get<int64_t>()] = step;
  const int64_t first_new = run.last_step_before_kill + 1;
  if (by_step.count(first_new) == 0) throw CommError(fmt::format("the {} job never trained step {}", name, first_new));
  run.seconds_to_first_new_step = by_step.at(first_new).at("time").get<double>() - kill_time;
  for (const auto& [step, record] : by_step) {
    if (step <= run.last_step_before_kill && record.at("time").get<double>() > kill_time) ++run.steps_trained_again;
  }
  // The steps before the kill that this attempt trained, five at most, the first one's start left out.
  const int64_t from = std::max<int64_t>(2, run.last_step_before_kill - 4);
  if (run.last_step_before_kill >= from && by_step.count(from - 1) != 0) {
    run.seconds_per_step = (by_step.at(run.last_step_before_kill).at("time").get<double>() -
                            by_step.at(from - 1).at("time").get<double>()) /
                           static_cast<double>(run.last_step_before_kill - from + 1);
  }
  // Full size again: the first step after the kill on every rank.
  run.seconds_to_full_size = -1;
  for (const auto& [step, record] : by_step) {
    if (step >= first_new && record.at("world_size").get<int>() == ranks) {
      run.seconds_to_full_size = record.at("time").get<double>() - kill_time;
      break;
    }
  }
  std::filesystem::remove_all(cwd);
  return run;
}

// The same job on TorchFT: its script drives it and prints the figures as JSON.
RecoveryRun run_torchft(const RecoveryBenchOptions& options, const std::string& python, int ranks, int round,
                        const ResultFolder& folder) {
  const std::string name = fmt::format("torchft_{}_{}", ranks, round);
  const std::filesystem::path result = folder / (name + ".json");
  run_or_throw(fmt::format("{} {} --replicas {} --steps {} --kill-after {} --batch-size {} --model {} --data {} > {}",
                           python, shell_quoted(options.torchft_script), ranks, options.steps, options.kill_after,
                           options.batch_size, options.model, shell_quoted(options.data_dir),
                           shell_quoted(result.string())),
               "the TorchFT job " + name);
  const nlohmann::json figures = read_result(result.string(), "the TorchFT job " + name);
  RecoveryRun run{ranks, "torchft", round};
  run.last_step_before_kill = figures.at("last_step_before_kill").get<int64_t>();
  run.seconds_to_first_new_step = figures.at("kill_to_first_new_step_s").get<double>();
  run.steps_trained_again = figures.at("steps_trained_again").get<int64_t>();
  const nlohmann::json& full = figures.at("kill_to_full_size_s");
  run.seconds_to_full_size = full.is_null() ? -1 : full.get<double>();
  return run;
}

// The table's rows for each number of ranks: tandem's recoveries, then TorchFT's where compared.
std::vector<std::string> recoveries_of(const RecoveryBenchOptions& options) {
  std::vector<std::string> recoveries = options.recoveries;
  if (options.compare_torchft) recoveries.push_back("torchft");
  return recoveries;
}

double median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const size_t middle = values.size() / 2;
  return values.size() % 2 == 1 ? values[middle] : (values[middle - 1] + values[middle]) / 2;
}

}  // namespace

std::vector<RecoveryRun> run_recovery_bench(const RecoveryBenchOptions& options) {
  ResultFolder folder;
  const std::string python = options.compare_torchft ? find_python_with_torchft() : "";
  std::vector<RecoveryRun> runs;
  for (int round = 0; round < options.rounds; ++round) {
    for (int ranks : options.ranks) {
      for (const std::string& recovery : recoveries_of(options)) {
        runs.push_back(recovery == "torchft" ? run_torchft(options, python, ranks, round, folder)
                                             : run_once(options, ranks, recovery, round, folder));
        const RecoveryRun& run = runs.back();
        fmt::print(stderr, "round {}: {} ranks, {}: killed after step {}; first new step {:.3f} s later\n", round + 1,
                   ranks, recovery, run.last_step_before_kill, run.seconds_to_first_new_step);
      }
    }
  }
  return runs;
}

void print_recovery_table(const std::vector<RecoveryRun>& runs, const RecoveryBenchOptions& options) {
  fmt::print("rank 1 SIGKILLed after step {} of {}; model {}, batch {} per rank, a checkpoint every {} steps; "
             "medians of {} round(s)\n",
             options.kill_after, options.steps, options.model, options.batch_size, options.checkpoint_every,
             options.rounds);
  fmt::print("| ranks | recovery | kill to first new step (s) | steps trained again | kill to full size (s) | a step "
             "before the kill (s) |\n");
  fmt::print("| --- | --- | --- | --- | --- | --- |\n");
  for (int ranks : options.ranks) {
    for (const std::string& recovery : recoveries_of(options)) {
      std::vector<double> first, again, full, step;
      for (const RecoveryRun& run : runs) {
        if (run.ranks != ranks || run.recovery != recovery) continue;
        first.push_back(run.seconds_to_first_new_step);
        again.push_back(static_cast<double>(run.steps_trained_again));
        full.push_back(run.seconds_to_full_size);
        step.push_back(run.seconds_per_step);
      }
      const double full_size = median(full);
      const double step_time = median(step);
      fmt::print("| {} | {} | {:.3f} | {:.0f} | {} | {} |\n", ranks, recovery, median(first), median(again),
                 full_size < 0 ? std::string("not within the run") : fmt::format("{:.3f}", full_size),
                 step_time < 0 ? std::string("-") : fmt::format("{:.3f}", step_time));
    }
  }
}

}  // namespace tandem::bench
