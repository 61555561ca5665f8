#pragma once
// The training loop, for a user's own model, loss, optimizer and data sets: what `tandem train` runs, and what
// the seeds' train_one_epoch/evaluate do by hand, with DDP, mixed precision and the rest built in. On every rank:
//
//   tandem::init_process_group();
//   Net net;                                                  // any module; seed it the same on every rank
//   torch::optim::AdamW optimizer(net->parameters(), torch::optim::AdamWOptions(1e-3));
//   tandem::train::LoopOptions options;
//   options.epochs = 5;
//   tandem::train::Loop loop(options);                       // the process group of init_process_group()
//   loop.callbacks().on_epoch_end = [](const tandem::train::EpochMetrics& m) { ... };
//   loop.fit(net, optimizer, train_set, test_set);           // data::Dataset pointers (data/torch_dataset_adapter.h
//                                                             // adapts torch::data datasets)
//
// What fit() does, per epoch: the DistributedSampler's order for (seed, epoch), one optimizer step per batch on
// DDP-averaged gradients (every rank starts from rank 0's weights; or, with Strategy::kDataParallel, one process's
// replicas in threads), the learning rate from the cosine schedule
// (lr_schedule.h), then evaluation on the test set sharded across ranks, each test sample counted once. Rank 0
// shows a progress bar, appends RUN_DIR/metrics.jsonl and writes a checkpoint (model, optimizer, schedule,
// sampler position, every rank's RNG state, the callbacks' extra state); a run dir holding one is continued
// from it, ending bit-identical to an uninterrupted run. A non-finite loss on any rank stops every rank at the
// same step with NonFiniteLossError.
//
// The optimizer may be an optim::ZeroRedundancyOptimizer over the same communicator (each rank keeps its share of
// the state; checkpoints consolidate it on rank 0 and hold what the plain optimizer would).
//
// Test hook: environment variable TANDEM_INJECT_NAN_AT_STEP=RANK:STEP makes rank RANK's loss NaN at optimizer
// step STEP (0-based, counted from the start of the run).
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "tandem/amp/grad_scaler.h"
#include "tandem/amp/precision.h"
#include "tandem/comm/communicator.h"
#include "tandem/data/dataset.h"
#include "tandem/ddp/powersgd_hook.h"
#include "tandem/monitor/timeline.h"
#include "tandem/nn/model_holder.h"
#include "tandem/train/checkpoint.h"
#include "tandem/train/metrics.h"
#include "tandem/util/error.h"

namespace tandem::train {

// output, target -> a scalar loss (the mean over the batch, as the loss is averaged over ranks as well).
using LossFunction = std::function<torch::Tensor(const torch::Tensor& output, const torch::Tensor& target)>;

// The default loss: cross-entropy on logits (the seeds' softmax before it was a bug: it trains on the wrong
// gradients).
torch::Tensor cross_entropy_loss(const torch::Tensor& logits, const torch::Tensor& target);

// How the model's work is spread. kDdp: one process per device or core group (tandem run), each a rank of
// DistributedDataParallel. kDataParallel: one process, the model replicated over LoopOptions::dp_devices in
// threads (dp/data_parallel.h); batch_size is then the whole step's batch, split among the replicas.
enum class Strategy { kDdp, kDataParallel };

struct LoopOptions {
  int epochs = 10;
  int64_t batch_size = 64;      // per rank
  int64_t max_steps = 0;        // stop after this many optimizer steps in all; 0: no limit
  uint64_t seed = 0;            // the data order, as PyTorch's DistributedSampler's seed
  bool shuffle = true;
  bool drop_last = true;        // training: drop each rank's last partial batch (evaluation keeps every sample)
  // Batches per optimizer step: all but the last run under DDP's no_sync (gradients accumulate locally), the last
  // reduces their sum, and each batch's loss is divided by their count, so a step's gradient is the mean over
  // its batches, as one batch that many times larger gives. An epoch whose batches do not divide ends on a
  // smaller step. Steps, max_steps, checkpoint_every and warmup_steps count optimizer steps.
  int64_t accumulate_batches = 1;
  // How DDP reduces gradients between processes (ddp/named_comm_hook.h): average, fp16, bf16 or powersgd
  // (configured by `powersgd`). Each fit() makes its own hook. Not with kDataParallel.
  std::string comm_hook = "average";
  ddp::PowerSgdOptions powersgd;
  // Training takes every sample once per epoch: no padding to a multiple of the world size, no dropped tail, so
  // the ranks get different numbers of batches. A rank out of batches shadows the others' steps (ddp/join.h): it
  // steps its optimizer with the gradient the others reduced, the mean over the ranks that trained in that step,
  // so every replica and optimizer state stays equal. A last batch of one sample joins the one before it. Needs
  // strategy ddp; not with max_steps, checkpoint_every or the powersgd comm hook (each refused up front).
  bool uneven_inputs = false;
  LossFunction loss = cross_entropy_loss;
  // The schedule (lr_schedule.h): each param group's lr at fit() is its base, multiplied by the world size
  // (the seeds' linear scaling) unless scale_lr_by_world_size is off, then decayed by a cosine per epoch to
  // base * lrf, after warmup_steps of linear warmup.
  double lrf = 0.1;             // 1: a constant rate
  int64_t warmup_steps = 0;
  bool scale_lr_by_world_size = true;
  // Where the model and the batches live. On a GPU, batches are prefetched into pinned memory and copied without
  // blocking the host.
  torch::Device device = torch::kCPU;
  int64_t prefetch_batches = 2;
  // Empty: runs/<timestamp>, chosen by rank 0. A run_dir that holds a checkpoint is continued from its newest
  // one, so a restarted job (tandem run --max-restarts) picks up where it stopped.
  std::string run_dir;
  // Without run_dir, under a launcher (tandem run, or torchrun with --rdzv-id): the run dir is
  // runs/<TORCHELASTIC_RUN_ID>, shared by every attempt of the job, so an attempt after a restart
  // (--max-restarts) continues from the newest checkpoint of the ones before it instead of starting over.
  bool continue_launcher_run = true;
  bool resume = false;          // without run_dir: continue the newest run under runs/
  bool checkpoint = true;       // rank 0 writes a checkpoint at each epoch end (and when max_steps stops the run)
  int64_t checkpoint_every = 0; // also every this many steps inside an epoch; 0: epoch ends only
  int keep_checkpoints = 3;     // the newest this many stay in run_dir; 0: all
  int64_t check_replicas_every = 100;  // DdpOptions::check_replicas_every; 0: never
  // 32, bf16-mixed or 16-mixed (amp/precision.h): the forward pass and the loss run under autocast to the
  // lower dtype, evaluation too; 16-mixed scales the loss with a GradScaler of these options, whose state
  // goes into the checkpoints. fit() refuses a precision the device or LibTorch cannot run.
  amp::Precision precision = amp::Precision::kFloat32;
  amp::GradScalerOptions grad_scaler;
  Strategy strategy = Strategy::kDdp;
  // kDataParallel's replicas, the first on `device`; empty: one per visible GPU where device is a GPU, else as
  // many CPU replicas as this process has intra-op threads.
  std::vector<torch::Device> dp_devices;
  bool progress = true;         // rank 0's progress bar / periodic lines
  // Rank 0 writes RUN_DIR/steps.jsonl and metrics.jsonl always; with `tensorboard` the same scalars as a
  // TensorBoard event file, with `report` RUN_DIR/report.html at the end (train/run_records.h).
  bool tensorboard = true;
  bool report = true;
  // Non-empty: a Chrome trace of timeline_steps on every rank (monitor/timeline.h) goes to this file, and their
  // means to RUN_DIR/timeline_summary.json, once the window's last step (or the run) ends.
  std::string timeline_path;
  monitor::StepWindow timeline_steps;
};

struct StepInfo {
  int epoch = 0;
  int64_t batch = 0;  // 0-based, within the epoch
  int64_t step = 0;   // optimizer steps done since the start of the run, this one included
  double loss = 0;    // this step's loss, averaged over the ranks
  double lr = 0;      // the first param group's rate for this step
  bool optimizer_stepped = true;  // false: 16-mixed's scaler skipped it (an inf or NaN gradient)
  double loss_scale = 1;          // the scaler's scale for the next step; 1 without one
};

// Every callback is optional. Those that every rank runs must issue the same collectives on every rank. A throw
// from on_run_start, on_epoch_start or on_epoch_end on any rank stops every rank; on_step, the loss and the
// model's forward run inside the step, where a throw on some ranks only leaves the others waiting in the next
// collective until its timeout, so they must fail alike on every rank or not at all.
//
// Bit-identical resume covers the random numbers drawn on the training thread (dropout, the user's own draws),
// restored per rank from the checkpoint. Data sets run on the loader's prefetch thread, ahead of training: their
// randomness must come from (seed, epoch, index), as ImageFolderDataset's augmentation does, not from the global
// generator.
struct LoopCallbacks {
  // every rank, once the run dir is chosen and the ranks agree on their data, before training; a throw on any
  // rank stops every rank
  std::function<void(const std::string& run_dir)> on_run_start;
  std::function<void(int epoch)> on_epoch_start;            // every rank, before the epoch's first (or, resumed
                                                            // inside it, next) batch
  std::function<void(const StepInfo&)> on_step;             // every rank, after each optimizer step
  std::function<void(const EpochMetrics&)> on_epoch_end;    // every rank, after evaluation
  std::function<ExtraState()> save_extra;                   // rank 0, into each checkpoint
  std::function<void(const ExtraState&)> load_extra;        // every rank, when a run is continued
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

class Loop {
 public:
  // Uses the process group of init_process_group() as fit() finds it, or a world of one if none was
  // initialised (an error where WORLD_SIZE says there are several processes).
  explicit Loop(LoopOptions options = {});
  // `communicator` null: a world of one. It must be the same group on every rank.
  Loop(LoopOptions options, comm::CommunicatorPtr communicator);

  LoopCallbacks& callbacks() { return callbacks_; }
  const LoopOptions& options() const { return options_; }

  // Trains `model` (forward(batch.data) -> output for the loss; logits for evaluation's accuracy) with
  // `optimizer`, which must hold the model's trainable parameters. eval_set null: no evaluation. Collective:
  // every rank calls it with the same model architecture, optimizer kind and data. The model is moved to
  // options().device and wrapped in DDP for the run; it holds the trained weights afterwards. The schedule sets
  // each param group's lr during the run; fit() gives every group back the lr it found, so a second fit() on the
  // same optimizer scales from the user's rate again.
  TrainResult fit(nn::ModelHolder model, torch::optim::Optimizer& optimizer,
                  std::shared_ptr<const data::Dataset> train_set, std::shared_ptr<const data::Dataset> eval_set);

  // Any module holder (a TORCH_MODULE type, torch::nn::Sequential), std::shared_ptr to a module, or AnyModule.
  template <typename Model, typename = std::enable_if_t<!std::is_same_v<std::decay_t<Model>, nn::ModelHolder>>>
  TrainResult fit(Model model, torch::optim::Optimizer& optimizer, std::shared_ptr<const data::Dataset> train_set,
                  std::shared_ptr<const data::Dataset> eval_set) {
    return fit(nn::hold_model(std::move(model)), optimizer, std::move(train_set), std::move(eval_set));
  }

 private:
  comm::CommunicatorPtr resolve_group() const;

  LoopOptions options_;
  comm::CommunicatorPtr communicator_;
  bool use_default_group_ = false;
  LoopCallbacks callbacks_;
};

}  // namespace tandem::train
