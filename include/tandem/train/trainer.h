#pragma once
// The training loop of `tandem train` (the seeds' train_multi_GPU main(), done right), in the library so that
// tests drive it directly. Every rank calls train() with the same options; apps/train.cpp only parses flags.
//
// Per epoch: the DistributedSampler's order for (seed, epoch), SGD steps on DDP-averaged gradients with the
// cosine schedule's lr, then evaluation on the test split sharded across ranks, each test sample counted once.
// Rank 0 prints `[epoch E] loss L accuracy A lr X`, appends RUN_DIR/metrics.jsonl and writes a checkpoint.
// A non-finite loss on any rank stops every rank at the same step (the flag travels with the loss all-reduce)
// with NonFiniteLossError naming the rank(s) and the step.
//
// Test hook: environment variable TANDEM_INJECT_NAN_AT_STEP=RANK:STEP makes rank RANK's loss NaN at optimizer
// step STEP (0-based, counted from the start of the run).
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "tandem/comm/communicator.h"
#include "tandem/data/batch_loader.h"
#include "tandem/data/mnist_dataset.h"
#include "tandem/train/metrics.h"
#include "tandem/util/error.h"

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
  int64_t prefetch_batches = 2;
  // Where the model, the batches and the metrics live (apps/train.cpp resolves --device; see util/device.h).
  // On a GPU, batches are prefetched into pinned memory and copied without blocking the host.
  torch::Device device = torch::kCPU;
  bool progress = true;                    // rank 0's progress bar / periodic lines
};

struct TrainResult {
  std::vector<EpochMetrics> epochs;  // the epochs this call evaluated
  int64_t steps = 0;                 // optimizer steps since the start of the run (resumed runs included)
  std::string run_dir;
};

// Thrown on every rank, at the same step, when any rank's loss is not finite.
class NonFiniteLossError : public Error {
 public:
  using Error::Error;
};

// Runs the whole training. `communicator` connects the ranks (null: a world of one) and must be the same
// group on every rank; the function issues the same collectives in the same order everywhere, so a failure
// it detects (bad file, non-finite loss) is raised on all ranks rather than leaving some waiting.
TrainResult train(const TrainOptions& options, const comm::CommunicatorPtr& communicator);

// Correct predictions and samples counted over all ranks' shards of a test set.
struct EvalCounts {
  int64_t correct = 0;
  int64_t total = 0;
  double accuracy() const { return total > 0 ? static_cast<double>(correct) / total : 0.0; }
};

// Evaluates `forward` (images -> logits) on `loader`'s epoch `epoch` under NoGradGuard, counting only the real
// rows of each batch (DistributedSampler padding excluded), then sums the counts over the ranks, so every test
// sample counts exactly once whatever the world size. Collective: all ranks call it together.
EvalCounts evaluate(const std::function<torch::Tensor(const torch::Tensor&)>& forward, data::BatchLoader& loader,
                    int64_t epoch, comm::Communicator* communicator);

// The training crop's default smallest area fraction for --image-size `image_size`: the one that keeps the
// smallest crop at torchvision's 0.08 * 224^2 pixels (about 63x63) of output, i.e. 0.08 at 224 and above,
// 0.32 at 112, 0.98 at 64, and 1 (whole image, aspect jitter and flip only) at 32. An 8% crop of a thumbnail is a
// few source pixels across and rarely still shows the object: on Fashion-MNIST at 32 px, ResNet-18 reached 83.6%
// in 5 epochs with a 0.56 floor and 87.0% with 1 (docs/data_pipeline.md).
double default_min_crop_scale(int64_t image_size);
// Validation resizes the shorter side to image_size * this, then center-crops image_size: torchvision's 256/224
// at 224 and above, nearer 1 as the resolution falls (1.02 at 32), because small images (Fashion-MNIST's 28 px
// garments fill the frame) lose their edges to the crop and then no longer look like the training crops, which
// cover up to the whole image.
double default_val_resize_ratio(int64_t image_size);

// The resolved configuration as `key: value` lines (what rank 0 prints at start).
std::string describe(const TrainOptions& options, int world_size);

}  // namespace tandem::train
