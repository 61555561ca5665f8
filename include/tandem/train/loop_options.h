#pragma once
// What train::Loop (train/loop.h) is told: the schedule, the data order, the strategy, the precision, the comm
// hook, checkpoints and records. validate() refuses the combinations that cannot train, naming the fields.
#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tandem/amp/grad_scaler.h"
#include "tandem/amp/precision.h"
#include "tandem/checkpoint/checkpoint_format.h"
#include "tandem/ddp/ddp_options.h"
#include "tandem/ddp/powersgd_hook.h"
#include "tandem/fsdp/fsdp_options.h"
#include "tandem/monitor/timeline.h"
#include "tandem/util/error.h"

namespace tandem::train {

// output, target -> a scalar loss (the mean over the batch, as the loss is averaged over ranks as well).
using LossFunction = std::function<torch::Tensor(const torch::Tensor& output, const torch::Tensor& target)>;

// The default loss: cross-entropy on logits (the seeds' softmax before it was a bug: it trains on the wrong
// gradients).
torch::Tensor cross_entropy_loss(const torch::Tensor& logits, const torch::Tensor& target);

// How the model's work is spread, each by one ParallelStrategy (train/parallel_strategy.h) that
// make_parallel_strategy() makes. kDdp: one process per device or core group (tandem run), each a rank of
// DistributedDataParallel. kDataParallel: one process, the model replicated over LoopOptions::dp_devices in
// threads (dp/data_parallel.h); batch_size is then the whole step's batch, split among the replicas. kFsdp: one
// process per device as kDdp, each rank holding one shard of every parameter, gradient and optimizer state
// (fsdp/fully_sharded_data_parallel.h, with LoopOptions::fsdp). The loop points the optimizer (SGD,
// Adam, AdamW or RMSprop, one param group of every parameter) at the shards for the run and back at the model's
// parameters, with the full state, at its end; checkpoints hold the full state, or with kSharded
// checkpoint_format each rank its pieces (docs/fsdp.md). bf16-mixed and 16-mixed compute on bfloat16 or float16
// parameters gathered from float32 shards and reduce gradients in float32.
// The average comm hook only; ddp.check_replicas_every does not apply (the ranks hold different shards).
enum class Strategy { kDdp, kDataParallel, kFsdp };

// CheckpointFormat moved to tandem/checkpoint/checkpoint_format.h; its name in tandem::train goes in the next release.
using checkpoint::CheckpointFormat;

inline std::string to_string(Strategy strategy) {
  switch (strategy) {
    case Strategy::kDataParallel: return "dp";
    case Strategy::kFsdp: return "fsdp";
    case Strategy::kDdp: break;
  }
  return "ddp";
}

// Throws InvalidArgument naming the three spellings.
inline Strategy parse_strategy(const std::string& name) {
  for (Strategy strategy : {Strategy::kDdp, Strategy::kDataParallel, Strategy::kFsdp}) {
    if (name == to_string(strategy)) return strategy;
  }
  throw InvalidArgument("strategy '" + name + "' is not one of ddp, dp, fsdp");
}

// The loop's DDP: PyTorch's defaults, but buckets adapted to the host (ddp/ddp_options.h) and the replicas
// compared every 100 steps.
inline ddp::DdpOptions default_loop_ddp_options() {
  ddp::DdpOptions options;
  options.bucket_plan = ddp::BucketPlan::kAdaptToHost;
  options.check_replicas_every = 100;
  return options;
}

struct LoopOptions {
  // What checkpoints call the model (tandem train's `model`, "cnn"): a run dir continued with a model of other
  // tensors is refused naming the one it was trained with. Empty: the refusal names the model's C++ type only.
  std::string model_name;
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
  // The schedule (lr_schedule.h): each param group's lr at fit() is its base, multiplied by the global batch
  // (world size x batch_size) over the batch_size the run started with (the seeds' linear scaling: the world size
  // for a new run, and the same rate for a continued run that keeps the global batch) unless
  // scale_lr_by_world_size is off, then decayed by a cosine per epoch to base * lrf, after warmup_steps of linear
  // warmup. Warmup counts optimizer steps, whatever their size; the cosine follows epochs, so a run continued on
  // another layout keeps its place in the decay.
  double lrf = 0.1;             // 1: a constant rate
  int64_t warmup_steps = 0;
  bool scale_lr_by_world_size = true;
  // Where the model and the batches live. On a GPU, batches are prefetched into pinned memory and copied without
  // blocking the host.
  torch::Device device = torch::kCPU;
  int64_t prefetch_batches = 2;
  // Empty: runs/<timestamp>, chosen by rank 0. A run_dir that holds a checkpoint is continued from its newest
  // one, so a restarted job (tandem run --max-restarts) picks up where it stopped, on any world size and
  // batch_size: its epoch goes on at the sample of its order where the checkpoint stopped (docs/checkpoint.md).
  std::string run_dir;
  // Without run_dir, under a launcher (tandem run, or torchrun with --rdzv-id): the run dir is
  // runs/<TORCHELASTIC_RUN_ID>, shared by every attempt of the job, so an attempt after a restart
  // (--max-restarts) continues from the newest checkpoint of the ones before it instead of starting over.
  bool continue_launcher_run = true;
  bool resume = false;          // without run_dir: continue the newest run under runs/
  bool checkpoint = true;       // rank 0 writes a checkpoint at each epoch end (and when max_steps stops the run)
  int64_t checkpoint_every = 0; // also every this many steps inside an epoch; 0: epoch ends only
  int keep_checkpoints = 3;     // the newest this many stay in run_dir (a sharded one with all its files); 0: all
  checkpoint::CheckpointFormat checkpoint_format = checkpoint::CheckpointFormat::kFull;
  // 32, bf16-mixed or 16-mixed (amp/precision.h): the forward pass and the loss run under autocast to the
  // lower dtype, evaluation too; 16-mixed scales the loss with a GradScaler of these options, whose state
  // goes into the checkpoints. fit() refuses a precision the device or LibTorch cannot run.
  amp::Precision precision = amp::Precision::kFloat32;
  amp::GradScalerOptions grad_scaler;
  Strategy strategy = Strategy::kDdp;
  // kDdp's wrapper, as ddp/ddp_options.h has it (buckets, broadcast_buffers, static_graph,
  // find_unused_parameters, check_replicas_every, ...). Its comm_hook stays null: the loop makes one per fit()
  // from `comm_hook` and `powersgd`.
  ddp::DdpOptions ddp = default_loop_ddp_options();
  // kFsdp's wrapper, as fsdp/fsdp_options.h has it: `units` (which modules are units: each direct child of the
  // model by default), reshard_after_forward (ZeRO-3's freeing of each unit after its forward), broadcast_buffers,
  // and mixed_precision's float32_module_types. mixed_precision's dtypes are `precision`'s to set (bf16-mixed and
  // 16-mixed gather bfloat16 or float16 parameters and reduce in float32), so they stay float32 here.
  fsdp::FsdpOptions fsdp;
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
  // In-job recovery (docs/recovery.md), for workers of `tandem run --recovery in-job`, whose process group holds
  // the job's membership (comm/membership.h): when a rank is lost, the others keep their processes and state, go
  // on without it from the newest step any of them completed, and take its replacement in at a step boundary,
  // healed from a peer over the communicator. Needs strategy ddp with a plain optimizer (the state must be whole
  // on every rank), and neither uneven_inputs nor a timeline.
  bool in_job_recovery = false;
};

// Throws InvalidArgument naming the fields (in backticks) when `options` cannot train in a world of
// `world_size` ranks: a value out of range, or two settings that do not go together. Loop::fit calls it first.
// The settings that depend on the strategy are the strategy's to check: `strategy`'s, or the one given.
void validate(const LoopOptions& options, int world_size);
class ParallelStrategy;
void validate(const LoopOptions& options, int world_size, const ParallelStrategy& strategy);

}  // namespace tandem::train
