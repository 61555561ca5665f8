#pragma once
// Training checkpoints: everything needed to continue a run as if it had never stopped. One safetensors file
// per save (see docs/checkpoint.md):
//   model.<name>             the model's parameters and buffers (PyTorch names)
//   optimizer.momentum.<name> SGD momentum buffers of the parameters that have one
//   __metadata__             format, epoch, step, batches_done, lr, base_lr, lrf, epochs, sampler_seed, world_size,
//                            and for a checkpoint inside an epoch epoch_loss_sum, epoch_steps, epoch_train_seconds
// Written by rank 0 only, atomically (temp file, fsync, rename), as RUN_DIR/checkpoint-<epoch>-<batch>.safetensors.
#include <torch/nn/module.h>
#include <torch/optim/sgd.h>

#include <optional>
#include <string>
#include <vector>

namespace tandem::train {

inline constexpr const char* kCheckpointFormat = "tandem-checkpoint-1";

struct CheckpointState {
  // The epoch being trained (0-based) and how many of its batches are done; a checkpoint at the end of epoch e
  // holds epoch e + 1 and batches_done 0.
  int epoch = 0;
  int64_t batches_done = 0;
  // Optimizer steps taken since the start of the run.
  int64_t step = 0;
  double lr = 0;       // the learning rate in use when saved
  double base_lr = 0;  // world-size-scaled --lr
  double lrf = 0;
  int epochs = 0;
  uint64_t sampler_seed = 0;
  int world_size = 1;
  // The unfinished epoch's training so far, for its metrics line (zero at an epoch boundary).
  double epoch_loss_sum = 0;
  int64_t epoch_steps = 0;
  double epoch_train_seconds = 0;
};

// Writes model + optimizer state + `state` to `path` atomically. `module` is the bare model (not a wrapper),
// so names are the PyTorch ones.
void save_checkpoint(const std::string& path, const torch::nn::Module& module, const torch::optim::SGD& optimizer,
                     const CheckpointState& state);

// Restores model weights and momentum buffers in place (strict: every tensor must match) and returns the state.
// Throws InvalidArgument naming the file if it is not a tandem checkpoint or does not fit the model.
CheckpointState load_checkpoint(const std::string& path, torch::nn::Module& module, torch::optim::SGD& optimizer);

// RUN_DIR/checkpoint-EEEE-BBBBBBBB.safetensors for (epoch, batches_done); names sort in training order.
std::string checkpoint_path(const std::string& run_dir, int epoch, int64_t batches_done);

// The checkpoints in run_dir, oldest first (epoch, then batch, compared as numbers). Temp files of an
// interrupted write are not checkpoints.
std::vector<std::string> list_checkpoints(const std::string& run_dir);

// The newest of list_checkpoints(run_dir), or nullopt if there is none.
std::optional<std::string> find_latest_checkpoint(const std::string& run_dir);

// Deletes the temp files of checkpoint writes that never finished (their process was killed); call only while
// no other process writes checkpoints into run_dir.
void remove_unfinished_checkpoints(const std::string& run_dir);

// Deletes all but the newest `keep` checkpoints in run_dir; keep <= 0 keeps them all. Throws Error naming a
// file that cannot be removed.
void prune_checkpoints(const std::string& run_dir, int keep);

// RUNS_DIR/NAME of the newest run under runs_dir that holds a checkpoint, or "" if none does. Run names are
// the trainer's timestamps, YYYYmmdd-HHMMSS with a -N suffix when that second is taken; the numbers in them are
// compared as numbers, so -10 is newer than -9.
std::string newest_run_dir(const std::string& runs_dir);

}  // namespace tandem::train
