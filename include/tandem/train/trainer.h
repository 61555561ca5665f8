#pragma once
// `tandem train`: the seeds' training program (train_multi_GPU's main(), done right), in the library so that
// tests drive it directly. Every rank calls train() with the same options; apps/train.cpp only parses flags.
// It opens --data (data/data_folder.h), builds the --model from the registry, loads --init weights, swaps in
// SyncBatchNorm, freezes layers, makes the seeds' SGD (sharded with --zero) and hands all of it to the training loop (train/loop.h),
// which does the rest: DDP, the schedule, evaluation, metrics, checkpoints and resume.
#include <cstdint>
#include <optional>
#include <string>

#include "tandem/amp/precision.h"
#include "tandem/comm/communicator.h"
#include "tandem/data/mnist_dataset.h"
#include "tandem/train/loop.h"

namespace tandem::train {

inline constexpr const char* kDefaultDataDir = "/usr/share/datasets/fashion-mnist";

struct TrainOptions {
  // An MNIST-format folder (train-/t10k- IDX files; evaluation on t10k) or an image folder (one sub-folder of
  // .jpg/.png images per class; evaluation on a stratified val_split of it, see data/image_folder.h).
  std::string data_dir = kDefaultDataDir;
  std::string model = "cnn";               // a name in nn/model_registry.h
  int64_t num_classes = 0;                 // 0: from the data (10 for MNIST, the class folders otherwise)
  bool sync_bn = false;                    // convert the model's BatchNorm layers to SyncBatchNorm
  int epochs = 10;
  int64_t batch_size = 64;                 // per process
  double lr = 0.01;                        // multiplied by the world size, as in the seeds
  double lrf = 0.1;                        // final lr = lr * lrf (cosine per epoch)
  double momentum = 0.9;
  double weight_decay = 0.005;
  // Shard the SGD state among the ranks (optim/zero_redundancy_optimizer.h); needs Strategy::kDdp.
  bool zero = false;
  int64_t max_steps = 0;                   // stop after this many optimizer steps in all; 0: no limit
  uint64_t seed = 0;                       // sampler seed and initial weights
  bool shuffle = true;
  std::optional<data::Normalization> normalization;  // MNIST only; unset: guessed from data_dir
  // Image folders only. image_size 0: 224 (an MNIST folder rejects any size but its own).
  int64_t image_size = 0;
  double val_split = 0.2;                  // fraction of each class held out for evaluation
  double min_crop_scale = 0;               // smallest random crop's area fraction; 0: by image size (below)
  bool skip_bad_images = false;            // drop unreadable images (counted) instead of stopping
  std::string init_weights;                // safetensors file to start from (--init/--weights)
  bool strict = false;                     // init_weights must match the model exactly
  bool freeze_layers = false;              // train only the classifier head
  std::string save_weights;                // final weights as safetensors (rank 0)
  // Empty: runs/<timestamp>, chosen by rank 0. A run_dir that holds a checkpoint is continued from its newest
  // one, so a restarted job (tandem run --max-restarts) picks up where it stopped.
  std::string run_dir;
  bool resume = false;                     // without run_dir: continue the newest run under runs/
  bool checkpoint = true;                  // rank 0 writes a checkpoint at each epoch end (and at --steps)
  int64_t checkpoint_every = 0;            // also every this many steps inside an epoch; 0: epoch ends only
  int keep_checkpoints = 3;                // the newest this many stay in run_dir; 0: all
  // DdpOptions::check_replicas_every: the ranks compare their weights every this many steps; 0: never.
  int64_t check_replicas_every = 100;
  bool uneven = false;                     // LoopOptions::uneven_inputs: every sample once, ranks' batches differ
  int64_t accumulate_batches = 1;          // LoopOptions::accumulate_batches
  std::string comm_hook = "average";       // LoopOptions::comm_hook
  ddp::PowerSgdOptions powersgd;           // LoopOptions::powersgd
  int64_t prefetch_batches = 2;
  // Where the model, the batches and the metrics live (apps/train.cpp resolves --device; see util/device.h).
  // On a GPU, batches are prefetched into pinned memory and copied without blocking the host.
  torch::Device device = torch::kCPU;
  bool progress = true;                    // rank 0's progress bar / periodic lines
  amp::Precision precision = amp::Precision::kFloat32;  // LoopOptions::precision
  Strategy strategy = Strategy::kDdp;      // LoopOptions::strategy
  int dp_replicas = 0;                     // Strategy::kDataParallel's replicas; 0: LoopOptions' default
  bool tensorboard = true;                 // LoopOptions::tensorboard
  bool report = true;                      // LoopOptions::report
  std::string timeline_path;               // LoopOptions::timeline_path
  monitor::StepWindow timeline_steps;      // LoopOptions::timeline_steps
};

// Runs the whole training. `communicator` connects the ranks (null: a world of one) and must be the same
// group on every rank; the function issues the same collectives in the same order everywhere, so a failure
// it detects (bad file, non-finite loss) is raised on all ranks rather than leaving some waiting.
TrainResult train(const TrainOptions& options, const comm::CommunicatorPtr& communicator);

// The resolved configuration as `key: value` lines (what rank 0 prints at start).
std::string describe(const TrainOptions& options, int world_size);

}  // namespace tandem::train
