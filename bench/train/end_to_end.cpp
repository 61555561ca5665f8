#include "bench/train/end_to_end.h"

#include <fmt/format.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "bench/harness/child_processes.h"
#include "bench/harness/host.h"
#include "bench/harness/rounds.h"
#include "tandem/util/atomic_file.h"
#include "tandem/util/error.h"
#include "tandem/util/output_path.h"

namespace tandem::bench {
namespace {

void check(const EndToEndOptions& o) {
  if (o.short_steps >= o.steps) {
    throw InvalidArgument(fmt::format("--short-steps {} must be fewer than --steps {}: the throughput is taken over "
                                      "the steps between them",
                                      o.short_steps, o.steps));
  }
  if (!std::filesystem::exists(o.pytorch_script)) {
    throw InvalidArgument(fmt::format("PyTorch side script {} not found; run from the source tree or pass "
                                      "--pytorch-script",
                                      o.pytorch_script));
  }
  if (!o.json_path.empty()) require_writable_file("--json", o.json_path);
}

// Runs `command` with its output into `log`, and returns its wall time. A failure shows the output, which
// names the cause, before the line that says which run failed.
double timed_run(const std::string& command, const std::filesystem::path& log, const std::string& what) {
  const auto start = std::chrono::steady_clock::now();
  try {
    run_or_throw(fmt::format("{} >{} 2>&1", command, shell_quoted(log.string())), what);
  } catch (const CommError&) {
    std::ifstream output(log);
    fmt::print(stderr, "{}", std::string(std::istreambuf_iterator<char>(output), {}));
    throw;
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// tandem's main job into a run dir of its own, removed afterwards: a run dir that holds a checkpoint would be
// continued, and each run must start from nothing.
double time_tandem(const EndToEndOptions& o, int64_t steps, const ResultFolder& folder) {
  const std::filesystem::path run_dir = folder / fmt::format("run-{}", steps);
  std::filesystem::remove_all(run_dir);
  const double seconds = timed_run(tandem_main_job_command(o, steps, run_dir.string()), folder / "tandem.log",
                                   fmt::format("tandem's main job ({} steps)", steps));
  std::filesystem::remove_all(run_dir);
  return seconds;
}

double time_pytorch(const EndToEndOptions& o, const std::string& python, int64_t steps, const ResultFolder& folder) {
  return timed_run(pytorch_end_to_end_command(o, python, steps), folder / "pytorch.log",
                   fmt::format("the PyTorch script ({} steps)", steps));
}

// The four runs of round `r`; the side that goes first alternates, so neither always meets a machine that the
// other has just warmed or heated.
EndToEndRound run_round(const EndToEndOptions& o, const std::string& python, int r, const ResultFolder& folder) {
  EndToEndRound round;
  const auto tandem_runs = [&] {
    round.tandem_long_s = time_tandem(o, o.steps, folder);
    round.tandem_short_s = time_tandem(o, o.short_steps, folder);
  };
  const auto pytorch_runs = [&] {
    round.pytorch_long_s = time_pytorch(o, python, o.steps, folder);
    round.pytorch_short_s = time_pytorch(o, python, o.short_steps, folder);
  };
  if (r % 2 == 0) {
    tandem_runs();
    pytorch_runs();
  } else {
    pytorch_runs();
    tandem_runs();
  }
  const int64_t samples_per_step = o.batch_size * o.nproc;
  round.tandem_samples_per_s =
      samples_per_second_between(o.short_steps, round.tandem_short_s, o.steps, round.tandem_long_s, samples_per_step);
  round.pytorch_samples_per_s =
      samples_per_second_between(o.short_steps, round.pytorch_short_s, o.steps, round.pytorch_long_s, samples_per_step);
  return round;
}

void write_json(const EndToEndOptions& o, const std::string& python, const std::vector<EndToEndRound>& rounds,
                double tandem_median, double pytorch_median, double ratio_median) {
  nlohmann::json per_round = nlohmann::json::array();
  for (const EndToEndRound& r : rounds) {
    per_round.push_back({{"tandem_short_s", r.tandem_short_s}, {"tandem_long_s", r.tandem_long_s},
                         {"pytorch_short_s", r.pytorch_short_s}, {"pytorch_long_s", r.pytorch_long_s},
                         {"tandem_samples_per_s", r.tandem_samples_per_s},
                         {"pytorch_samples_per_s", r.pytorch_samples_per_s}, {"ratio", r.ratio()}});
  }
  const nlohmann::json json = {
      {"benchmark", "end-to-end"},
      {"host", host_name()},
      {"cpu", cpu_model()},
      {"steps", o.steps},
      {"short_steps", o.short_steps},
      {"nproc", o.nproc},
      {"batch_size", o.batch_size},
      {"threads", o.threads},
      {"tandem_command", tandem_main_job_command(o, o.steps, "RUN_DIR")},
      {"pytorch_command", pytorch_end_to_end_command(o, python, o.steps)},
      {"rounds", per_round},
      {"tandem_samples_per_s_median", tandem_median},
      {"pytorch_samples_per_s_median", pytorch_median},
      {"ratio_median", ratio_median}};
  write_file_atomically(o.json_path, json.dump(2) + "\n");
}

}  // namespace

double samples_per_second_between(int64_t short_steps, double short_seconds, int64_t long_steps, double long_seconds,
                                  int64_t samples_per_step) {
  if (long_seconds <= short_seconds) {
    throw CommError(fmt::format("the run of {} steps took {:.2f} s, no longer than the run of {} steps ({:.2f} s): "
                                "the machine was disturbed; run again, or with more --steps",
                                long_steps, long_seconds, short_steps, short_seconds));
  }
  return static_cast<double>(long_steps - short_steps) * static_cast<double>(samples_per_step) /
         (long_seconds - short_seconds);
}

std::string tandem_main_job_command(const EndToEndOptions& o, int64_t steps, const std::string& run_dir) {
  const std::string program = shell_quoted(o.program);
  return fmt::format("{} run --nproc-per-node {} -- {} train --steps {} --batch-size {} --threads {} --run-dir {}",
                     program, o.nproc, program, steps, o.batch_size, o.threads, shell_quoted(run_dir));
}

std::string pytorch_end_to_end_command(const EndToEndOptions& o, const std::string& python, int64_t steps) {
  return fmt::format("{} {} --nproc {} --steps {} --batch-size {} --threads {}", python,
                     shell_quoted(o.pytorch_script), o.nproc, steps, o.batch_size, o.threads);
}

std::vector<EndToEndRound> run_end_to_end(const EndToEndOptions& o) {
  check(o);
  const std::string python = find_python("--end-to-end");
  const ResultFolder folder;
  fmt::print("# end to end: tandem's main job with train's defaults vs a lean PyTorch DDP script\n");
  fmt::print("# host {} ({}), {} processes x {} thread(s), batch {} per process\n", host_name(), cpu_model(), o.nproc,
             o.threads, o.batch_size);
  fmt::print("# tandem:  {}\n", tandem_main_job_command(o, o.steps, "RUN_DIR"));
  fmt::print("# pytorch: {}\n", pytorch_end_to_end_command(o, python, o.steps));
  fmt::print("# samples/s over the {} steps between runs of {} and {} steps\n", o.steps - o.short_steps,
             o.short_steps, o.steps);
  fmt::print("{:>6} {:>13} {:>13} {:>14} {:>14} {:>8}\n", "round", "tandem(s)", "pytorch(s)", "tandem(samp/s)",
             "pytorch(samp/s)", "ratio");
  std::vector<EndToEndRound> rounds;
  for (int r = 0; r < o.rounds; ++r) {
    rounds.push_back(run_round(o, python, r, folder));
    const EndToEndRound& round = rounds.back();
    fmt::print("{:>6} {:>6.2f}/{:<6.2f} {:>6.2f}/{:<6.2f} {:>14.0f} {:>15.0f} {:>8.3f}\n", r + 1, round.tandem_long_s,
               round.tandem_short_s, round.pytorch_long_s, round.pytorch_short_s, round.tandem_samples_per_s,
               round.pytorch_samples_per_s, round.ratio());
    std::fflush(stdout);
  }
  std::vector<double> tandem, pytorch, ratios;
  for (const EndToEndRound& r : rounds) {
    tandem.push_back(r.tandem_samples_per_s);
    pytorch.push_back(r.pytorch_samples_per_s);
    ratios.push_back(r.ratio());
  }
  const double tandem_median = median_of(tandem), pytorch_median = median_of(pytorch), ratio_median = median_of(ratios);
  fmt::print("{:>6} {:>13} {:>13} {:>14.0f} {:>15.0f} {:>8.3f}\n", "median", "", "", tandem_median, pytorch_median,
             ratio_median);
  if (!o.json_path.empty()) write_json(o, python, rounds, tandem_median, pytorch_median, ratio_median);
  return rounds;
}

}  // namespace tandem::bench
