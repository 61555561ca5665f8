#pragma once
// Training checkpoints: everything needed to continue a run as if it had never stopped, for any optimizer.
// One safetensors file per save (see docs/checkpoint.md):
//   model.<name>        the model's parameters and buffers (PyTorch names)
//   optimizer.archive   the optimizer's own serialization (Optimizer::save: its param groups with their options
//                       and every per-parameter state, e.g. SGD momentum or Adam's moments and step counts)
//   rng.cpu, rng.device each rank's random generator state, one row per rank (when the caller saves them)
//   extra.<name>        the user's own tensors (ExtraState)
//   __metadata__        format, model_class and optimizer (their C++ types), the archive's fingerprint, the
//                       LibTorch major version,
//                       epoch, step, batches_done, sample_position, the schedule (with initial_batch_size and
//                       initial_accumulate_batches), accumulate_batches, the
//                       data order (sampler_seed, world_size, batch_size, shuffle, drop_last), the training set
//                       (train_samples, train_fingerprint),
//                       the unfinished epoch's loss and time, the precision and the loss scaler's state
//                       (grad_scaler.*, 16-mixed), extra.<key>, and the checksums: crc32c.<entry> of each
//                       entry's bytes, crc32c.__header__ of everything else in the header
// Written by rank 0 only, atomically (temp file, fsync, rename); where they live: checkpoint/checkpoint_folder.h.
// A sharded checkpoint of an fsdp run (LoopOptions::checkpoint_format) keeps the parameters and their optimizer
// state in pieces, one file per rank, beside this file (docs/checkpoint.md); load_checkpoint gathers them whole.
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <map>
#include <optional>
#include <string>

#include "tandem/amp/grad_scaler.h"
#include "tandem/checkpoint/checkpoint_format.h"
#include "tandem/checkpoint/rng_state.h"

namespace tandem::optim {
class ZeroRedundancyOptimizer;
}  // namespace tandem::optim

namespace tandem::checkpoint {

struct CheckpointState {
  // The epoch being trained (0-based) and how many of its batches are done; a checkpoint at the end of epoch e
  // holds epoch e + 1 and batches_done 0. batches_done counts each rank's batches of the layouts (world size,
  // batch size) the epoch was trained on so far, so it only grows through an epoch; it names the checkpoint.
  int epoch = 0;
  int64_t batches_done = 0;
  // Where those batches reach in the epoch's order: its positions [0, sample_position) are trained (0 at an
  // epoch boundary). A run continues the epoch there on any world size and batch size. -1 in checkpoints of
  // tandems that did not record it: batches_done * batch_size * world_size, capped at train_samples.
  int64_t sample_position = 0;
  // Optimizer steps taken since the start of the run.
  int64_t step = 0;
  double lr = 0;       // the learning rate of the first param group when saved
  double base_lr = 0;  // the first param group's initial lr, scaled by the global batch (train/loop_options.h)
  // The per-rank batch size the run started with, which the learning rate's scale divides the global batch by;
  // 0 in checkpoints of tandems that did not record it (their batch_size stands for it).
  int64_t initial_batch_size = 0;
  // Batches per optimizer step (LoopOptions::accumulate_batches) where the run started and in the layout that
  // wrote the checkpoint: each step's global batch is world_size x batch_size x accumulate_batches. 0 in
  // checkpoints of tandems that did not record them (the continued run's own stands for both).
  int64_t initial_accumulate_batches = 0;
  int64_t accumulate_batches = 0;
  double lrf = 0;
  int64_t warmup_steps = 0;
  int epochs = 0;
  // The data order of the layout that wrote the checkpoint.
  uint64_t sampler_seed = 0;
  int world_size = 1;
  int64_t batch_size = 0;  // per rank
  bool shuffle = true;
  bool drop_last = true;
  // The training set those batches are cut from: its size and Dataset::fingerprint() (0: it cannot tell). Both
  // 0 in checkpoints of tandems that did not record it.
  int64_t train_samples = 0;
  uint64_t train_fingerprint = 0;
  // The unfinished epoch's training so far, for its metrics line (zero at an epoch boundary).
  double epoch_loss_sum = 0;
  int64_t epoch_steps = 0;
  double epoch_train_seconds = 0;
  int64_t epoch_samples = 0;  // trained on, over every rank (partial batches count what they hold)
  // Every rank's random generators (undefined tensors when not saved).
  RngStates rng;
  // The precision trained in (amp/precision.h's spelling) and, where it scales the loss, the scaler's state.
  std::string precision = "32";
  std::optional<amp::GradScalerState> grad_scaler;
  // The model's name as the run calls it (LoopOptions::model_name: tandem train's `model`), so that a run dir
  // continued with another model says which one it was trained with; empty when the run gave none, and in
  // checkpoints of older tandems.
  std::string model_name;
};

// The user's own state, saved with each checkpoint and handed back on resume: tensors (saved from any device,
// returned on the CPU) and strings. Names are free-form but must not be empty.
struct ExtraState {
  std::map<std::string, torch::Tensor> tensors;
  std::map<std::string, std::string> values;
};

// Writes model + optimizer + `state` (+ `extra`) to `path` atomically. `module` is the bare model (not a wrapper),
// so names are the PyTorch ones.
void save_checkpoint(const std::string& path, const torch::nn::Module& module, const torch::optim::Optimizer& optimizer,
                     const CheckpointState& state, const ExtraState& extra = {});
// The same for sharded optimizer state, which is saved as the plain optimizer of its local kind would save it, so
// that the run continues with or without sharding. It must have been consolidated onto the calling rank
// (consolidate_state_dict, on every rank) since its last step.
void save_checkpoint(const std::string& path, const torch::nn::Module& module,
                     const optim::ZeroRedundancyOptimizer& optimizer, const CheckpointState& state,
                     const ExtraState& extra = {});

// Restores model weights (strict: every tensor must match) and the optimizer's state in place, its tensors on
// the model's device, fills `extra` when given, and returns the state. Every entry and the header are checked
// against their checksums first, before anything is restored. Throws InvalidArgument, one line naming the file:
// when it is damaged (naming the entry whose checksum fails), truncated or not a tandem checkpoint, the line
// says to move it aside (the run dir's previous checkpoint is then continued) or to start another run
// (checkpoint/checkpoint_damage.h asks the same on its own); when it does not fit the model, it names the model it
// was written for, this one, and the first tensor that differs;
// and when it was written with another kind of optimizer or by a build with another LibTorch major version (the
// optimizer's archive does not carry across), it names both. The optimizer keeps its own
// options (lr aside, which the caller's schedule sets); only its state comes from the file. A checkpoint of
// the first format (tandem-checkpoint-1, SGD momentum only) still restores into an SGD optimizer. Checkpoints of
// the formats before checksums (tandem-checkpoint-1 and -2) load unverified, with a note in the log.
CheckpointState load_checkpoint(const std::string& path, torch::nn::Module& module, torch::optim::Optimizer& optimizer,
                                ExtraState* extra = nullptr);
// The same into sharded optimizer state: each rank keeps its share of the saved state. A sharded checkpoint of
// an fsdp run is refused in one line (its pieces fill per-parameter state, which this optimizer does not keep).
CheckpointState load_checkpoint(const std::string& path, torch::nn::Module& module,
                                optim::ZeroRedundancyOptimizer& optimizer, ExtraState* extra = nullptr);

// The C++ type of an optimizer as a checkpoint records it, e.g. "torch::optim::AdamW"; for a sharded one, its
// local optimizer's type, whose format its consolidated state has.
std::string optimizer_kind(const torch::optim::Optimizer& optimizer);
std::string optimizer_kind(const optim::ZeroRedundancyOptimizer& optimizer);

}  // namespace tandem::checkpoint
