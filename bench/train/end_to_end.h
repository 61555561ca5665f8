#pragma once
// `tandem bench train --end-to-end`: the main job timed as a user meets it, against a lean PyTorch script.
//
// Each round runs, as whole processes timed from the outside, tandem's main job with every default of
// `tandem train` on (`tandem run --nproc-per-node N -- tandem train --steps S --batch-size B --threads T`, into a
// fresh temporary run dir) and bench/train/pytorch_end_to_end.py, each at a long and a short step count. Throughput is
// the steps between them times the samples of a step over the difference in wall time, so that start-up, data
// loading, the evaluation and the last checkpoint, which both runs of a side share, cancel. Within a round the
// four runs are interleaved (tandem and PyTorch alternate who goes first from round to round) and the ratio is
// taken within the round; figures are medians over rounds.
#include <cstdint>
#include <string>
#include <vector>

namespace tandem::bench {

struct EndToEndOptions {
  std::string program;  // this `tandem` executable
  std::string pytorch_script = "bench/train/pytorch_end_to_end.py";
  int rounds = 3;
  int64_t steps = 240;       // the long run of each side
  int64_t short_steps = 40;  // the short run, whose time is subtracted; fewer than `steps`
  int nproc = 2;
  int64_t batch_size = 64;  // per process
  int threads = 1;          // intra-op threads per process
  std::string json_path;    // empty: no JSON
};

// Samples per second between a short and a long run of the same job: (long_steps - short_steps) steps of
// `samples_per_step` over the difference of their wall times. Throws CommError where the long run did not take
// longer, which no steady measurement gives (the machine was disturbed, or the step counts are too close).
double samples_per_second_between(int64_t short_steps, double short_seconds, int64_t long_steps, double long_seconds,
                                  int64_t samples_per_step);

// The shell commands of one run, `program` and the script already quoted: tandem's main job with its defaults
// into `run_dir`, and the PyTorch script.
std::string tandem_main_job_command(const EndToEndOptions& options, int64_t steps, const std::string& run_dir);
std::string pytorch_end_to_end_command(const EndToEndOptions& options, const std::string& python, int64_t steps);

// One round's four wall times and what they give.
struct EndToEndRound {
  double tandem_short_s = 0, tandem_long_s = 0, pytorch_short_s = 0, pytorch_long_s = 0;
  double tandem_samples_per_s = 0, pytorch_samples_per_s = 0;
  double ratio() const { return tandem_samples_per_s / pytorch_samples_per_s; }
};

// Checks the settings (InvalidArgument), runs the rounds, prints a row per round and the medians, and writes
// the JSON. A run that fails ends the bench with CommError, its output shown; every temporary run dir is removed
// on every way out.
std::vector<EndToEndRound> run_end_to_end(const EndToEndOptions& options);

}  // namespace tandem::bench
