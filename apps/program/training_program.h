#pragma once
// `tandem train`'s program: the seeds' train_multi_GPU main(), done right, on top of the library. It opens
// --data (data/data_folder.h), builds the --model from the registry, loads --init weights, swaps in
// SyncBatchNorm, freezes layers, makes the optimizer (the seeds' SGD by default; sharded with --zero) and hands
// all of it to the training loop (tandem/train/loop.h), which does the rest: DDP, the schedule, evaluation,
// metrics, checkpoints and resume. apps/train.cpp binds the flags to these options; every rank calls run_training() with the same ones.
#include <cstdint>
#include <string>
#include <vector>

#include "tandem/comm/communicator.h"
#include "tandem/data/data_folder.h"
#include "tandem/train/loop.h"

namespace tandem::app {

inline constexpr const char* kDefaultDataDir = "/usr/share/datasets/fashion-mnist";

// The program's settings are the library's own option structs, which the flags fill in directly, and the few
// that only the program has.
struct TrainingProgramOptions {
  TrainingProgramOptions() { data.dir = kDefaultDataDir; }

  // --data and its options. data.seed is not a flag of its own: run_training() sets it to loop.seed.
  data::DataFolderOptions data;
  // Epochs, batch size, schedule, strategy, precision, comm hook, checkpoints, records: everything the loop owns.
  train::LoopOptions loop;
  std::string model = "cnn";  // a name in nn/model_registry.h
  bool sync_bn = false;       // convert the model's BatchNorm layers to SyncBatchNorm
  std::string init_weights;   // safetensors file to start from (--init/--weights)
  bool strict = false;        // init_weights must match the model exactly
  bool freeze_layers = false; // train only the classifier head
  std::string save_weights;   // final weights as safetensors (rank 0)
  // The optimizer: the seeds' SGD by default, or Adam, AdamW or RMSprop (PyTorch's formulas, LibTorch's classes).
  // lr is per rank: the loop multiplies it by the global batch over the run's first per-rank batch (the world size,
  // unless a continued run changed the global batch).
  std::string optimizer = "sgd";  // sgd, adam, adamw or rmsprop
  double lr = 0.01;
  double momentum = 0.9;                // sgd, rmsprop
  double weight_decay = 0.005;          // all four (AdamW's decoupled)
  std::vector<double> betas = {0.9, 0.999};  // adam, adamw
  double eps = 1e-8;                    // adam, adamw, rmsprop
  // Also start the optimizer's state (moments, step counts) from init_weights, a PyTorch distributed checkpoint
  // saved as {"model": ..., "optimizer": ...}.
  bool init_optimizer = false;
  bool zero = false;          // shard the SGD state among the ranks (optim/zero_redundancy_optimizer.h)
  int dp_replicas = 0;        // --strategy dp's replicas; 0: dp::replica_devices' default
};

// Refuses the combinations of program settings that cannot train, in one line naming the flags: --sync-bn on a
// model without BatchNorm, and the flags that need a --strategy other than the one given. Call it before any work,
// the rendezvous included; it depends on the options alone, so every rank refuses alike. The loop checks its own
// options when it starts.
void validate(const TrainingProgramOptions& options);

// Runs the whole training with options that passed validate(). `communicator` connects the ranks (null: a world
// of one) and must be the same group on every rank; the same collectives run in the same order everywhere, so a
// failure found on one rank (a bad file, a non-finite loss) is raised on all of them rather than leaving some
// waiting.
train::TrainResult run_training(const TrainingProgramOptions& options, const comm::CommunicatorPtr& communicator);

}  // namespace tandem::app
