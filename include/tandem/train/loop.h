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
// The optimizer may be an optim::ZeroRedundancyOptimizer over the same communicator, passed as one (fit() has an
// overload for it): each rank keeps its share of the state, and checkpoints consolidate it on rank 0 and hold
// what the plain optimizer would.
//
// The options, and the combinations the loop refuses, are in train/loop_options.h; the life cycle of a run, with
// the collectives each stage runs, in docs/loop.md. Test hook: TANDEM_INJECT_NAN_AT_STEP (util/fault_injection.h).
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "tandem/checkpoint/checkpoint.h"
#include "tandem/comm/communicator.h"
#include "tandem/comm/membership.h"
#include "tandem/data/dataset.h"
#include "tandem/nn/model_holder.h"
#include "tandem/optim/zero_redundancy_optimizer.h"
#include "tandem/train/loop_options.h"
#include "tandem/train/metrics.h"
#include "tandem/train/parallel_strategy.h"
#include "tandem/util/error.h"

namespace tandem::train {

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
  // every rank, once the run dir is chosen and the ranks agree on their data, before training; `checkpoint` is
  // the one the run continues from (empty: a new run), whether or not `resume` asked for it. A throw on any rank
  // stops every rank
  std::function<void(const std::string& run_dir, const std::string& checkpoint)> on_run_start;
  std::function<void(int epoch)> on_epoch_start;            // every rank, before the epoch's first (or, resumed
                                                            // inside it, next) batch
  std::function<void(const StepInfo&)> on_step;             // every rank, after each optimizer step
  std::function<void(const EpochMetrics&)> on_epoch_end;    // every rank, after evaluation
  std::function<checkpoint::ExtraState()> save_extra;                   // rank 0, into each checkpoint
  std::function<void(const checkpoint::ExtraState&)> load_extra;        // every rank, when a run is continued
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
  // options().device and wrapped in DDP (or FSDP, Strategy::kFsdp, with the optimizer stepping the shards) for the
  // run; it holds the trained weights afterwards, and the optimizer its parameters with the whole state. The schedule sets
  // each param group's lr during the run; fit() gives every group back the lr it found, so a second fit() on the
  // same optimizer scales from the user's rate again.
  TrainResult fit(nn::ModelHolder model, torch::optim::Optimizer& optimizer,
                  std::shared_ptr<const data::Dataset> train_set, std::shared_ptr<const data::Dataset> eval_set);
  // The same with sharded optimizer state: before each checkpoint every rank sends its share to rank 0.
  TrainResult fit(nn::ModelHolder model, optim::ZeroRedundancyOptimizer& optimizer,
                  std::shared_ptr<const data::Dataset> train_set, std::shared_ptr<const data::Dataset> eval_set);
  // The same with the model spread by `strategy` (train/parallel_strategy.h), not yet wrapped, in place of the one
  // options().strategy names (make_parallel_strategy(), which the overloads above pass here).
  TrainResult fit(std::unique_ptr<ParallelStrategy> strategy, nn::ModelHolder model, torch::optim::Optimizer& optimizer,
                  std::shared_ptr<const data::Dataset> train_set, std::shared_ptr<const data::Dataset> eval_set);

  // Any module holder (a TORCH_MODULE type, torch::nn::Sequential), std::shared_ptr to a module, or AnyModule,
  // with either kind of optimizer.
  template <typename Model, typename OptimizerType,
            typename = std::enable_if_t<!std::is_same_v<std::decay_t<Model>, nn::ModelHolder>>>
  TrainResult fit(Model model, OptimizerType& optimizer, std::shared_ptr<const data::Dataset> train_set,
                  std::shared_ptr<const data::Dataset> eval_set) {
    return fit(nn::hold_model(std::move(model)), optimizer, std::move(train_set), std::move(eval_set));
  }

 private:
  comm::CommunicatorPtr resolve_group() const;
  // The default group's membership under LoopOptions::in_job_recovery, else null; refuses a group without one.
  std::shared_ptr<comm::Membership> resolve_membership() const;

  LoopOptions options_;
  comm::CommunicatorPtr communicator_;
  bool use_default_group_ = false;
  LoopCallbacks callbacks_;
};

}  // namespace tandem::train
