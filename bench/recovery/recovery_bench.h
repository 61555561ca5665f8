#pragma once
// The measurement behind `tandem bench recovery`: what a lost worker costs a job under `tandem run --recovery
// restart` and `--recovery in-job` (docs/recovery.md), side by side. Each run is a real job on loopback:
//   tandem run --nproc-per-node N --max-restarts 1 --recovery MODE -- tandem train --steps S --checkpoint-every C ...
// Once rank 0's steps.jsonl holds step K, the driver SIGKILLs rank 1's process from outside (as a failed machine
// would: no message, no flush) and notes the wall time. From steps.jsonl, whose records carry the time each step
// ended and its world size, it then reads: the time from the kill to the end of the first new step (the step after
// the last one recorded before the kill); the steps trained again (records of steps up to that one written after
// the kill); and the time from the kill until a step ran at full size again. With `compare_torchft` the same job
// runs on PyPI's TorchFT beside them (bench/recovery/torchft_recovery.py: one replica group per rank, its
// lighthouse on loopback, rank 1's replica SIGKILLed and started again), measured the same way.
#include <cstdint>
#include <string>
#include <vector>

namespace tandem::bench {

struct RecoveryBenchOptions {
  std::string program;  // this `tandem`, for `tandem run` and `tandem train`
  std::string data_dir;
  std::string model = "cnn";
  std::vector<int> ranks{2, 3, 4};
  std::vector<std::string> recoveries{"restart", "in-job"};
  int64_t batch_size = 32;
  int64_t steps = 300;
  int64_t kill_after = 100;  // the step whose record triggers the kill
  int64_t checkpoint_every = 20;
  int rounds = 1;
  bool compare_torchft = false;
  std::string torchft_script = "bench/recovery/torchft_recovery.py";
};

struct RecoveryRun {
  int ranks = 0;
  std::string recovery;
  int round = 0;
  int64_t last_step_before_kill = 0;
  double seconds_to_first_new_step = 0;
  int64_t steps_trained_again = 0;
  double seconds_to_full_size = 0;
  // How long a step took before the kill (the mean of the last few): the first new step includes one. -1: unknown.
  double seconds_per_step = -1;
};

// Runs every (ranks, recovery) pair once per round, the pairs of a round side by side. Throws CommError naming
// the run when a job fails or never reaches the kill's step.
std::vector<RecoveryRun> run_recovery_bench(const RecoveryBenchOptions& options);
void print_recovery_table(const std::vector<RecoveryRun>& runs, const RecoveryBenchOptions& options);

}  // namespace tandem::bench
