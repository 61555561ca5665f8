#pragma once
// One call of Loop::fit (train/loop.h): the model wrapped for the run by its strategy (train/parallel_strategy.h),
// its loaders and writers, and where training stands. Its stages live in files of their own: the set-up in
// run_setup.cpp, the epoch and step loop in loop.cpp, continuing from and writing checkpoints in
// run_checkpoints.cpp, evaluation and the epoch's records in run_evaluation.cpp, in-job recovery's change of
// membership in run_recovery.cpp. docs/loop.md follows a run
// through them, with the collectives each stage runs.
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "step_statistics.h"
#include "tandem/amp/autocast.h"
#include "tandem/amp/grad_scaler.h"
#include "tandem/comm/membership.h"
#include "tandem/data/batch_loader.h"
#include "tandem/train/loop.h"
#include "tandem/train/lr_schedule.h"
#include "tandem/train/parallel_strategy.h"
#include "tandem/train/progress.h"
#include "tandem/train/run_recorder.h"
#include "tandem/train/run_timeline.h"

namespace tandem::train {

// Where an epoch's training stands: restored from a checkpoint taken inside it, or from zero. A checkpoint
// written on another layout (world size x batch size) continues at its position in the epoch's order: this run's
// batches then start at first_position, and batches_done counts on from the checkpoint's count.
struct EpochProgress {
  int64_t batches_done = 0;  // of rank 0, through every layout the epoch was trained on
  double loss_sum = 0;  // of the per-step losses averaged over ranks
  int64_t steps = 0;
  int64_t samples = 0;  // trained on, over every rank
  double seconds = 0;   // training time, before a resume included
  int64_t first_position = 0;  // where this run's loader started the epoch's order
  int64_t first_batch = 0;     // batches_done there
  int64_t steps_in_epoch = 0;  // the epoch's steps in all, those before a resume included (set as it starts)
};

// Where `state` (a checkpoint's, or the state a member sent under in-job recovery) stands inside its epoch, this
// run's loader going on at `position` of the epoch's order.
inline EpochProgress progress_of(const checkpoint::CheckpointState& state, int64_t position) {
  return {state.batches_done, state.epoch_loss_sum, state.epoch_steps, state.epoch_samples, state.epoch_train_seconds,
          position, state.batches_done};
}

class Run {
 public:
  // `strategy` is still to wrap the model: the run does so once its run dir is chosen.
  // `membership`: the job's, under in-job recovery (LoopOptions::in_job_recovery), else null; then the run's
  // communicator is its current one, and none for a replacement not yet taken in.
  Run(const LoopOptions& options, const LoopCallbacks& callbacks, comm::CommunicatorPtr communicator,
      std::shared_ptr<comm::Membership> membership, std::unique_ptr<ParallelStrategy> strategy,
      nn::ModelHolder model, torch::optim::Optimizer& optimizer, std::shared_ptr<const data::Dataset> train_set,
      std::shared_ptr<const data::Dataset> eval_set);
  ~Run();
  Run(const Run&) = delete;
  Run& operator=(const Run&) = delete;

  TrainResult execute();

 private:
  // run_setup.cpp: the model wrapped, and the records opened.
  void wrap_model();
  // The loaders for this rank of this world (again when in-job recovery changed it); returns the epoch's batches.
  int64_t make_loaders();
  void open_records(int64_t batches_per_epoch);

  // loop.cpp: the epoch and the step.
  EpochProgress train_epoch(int epoch, EpochProgress progress);
  void start_epoch_part(int epoch, EpochProgress& progress);
  bool train_epoch_part(int epoch, EpochProgress& progress, const std::function<double()>& seconds_so_far);
  StepStatistics train_step(int epoch, int64_t batch_index, const std::vector<data::Batch>& batches);
  StepStatistics shadow_step(int epoch, int64_t batch_index);
  void complete_step(int epoch, int64_t batch_index, const StepStatistics& stats,
                     std::chrono::steady_clock::time_point start);
  void count_step(EpochProgress& progress, const StepStatistics& stats);
  void set_lr(int epoch);
  // The base rates: each group's lr times the global batch over the run's first one (LoopOptions).
  void scale_base_lrs();
  // The end of the epoch's order that `progress` has trained to: checkpoints record it.
  int64_t position_done(const EpochProgress& progress) const;
  bool steps_exhausted() const { return options_.max_steps > 0 && step_ >= options_.max_steps; }
  // Runs `pass` (a forward, and the loss) under the run's autocast, if it has one.
  template <typename Pass>
  auto in_precision(Pass&& pass) {
    std::optional<amp::Autocast> autocast;
    if (autocast_dtype_) autocast.emplace(options_.device.type(), *autocast_dtype_);
    return pass();
  }

  // run_checkpoints.cpp: continuing from a checkpoint, and writing one.
  void resume_from(const std::string& checkpoint);
  void continue_layout();
  checkpoint::CheckpointState checkpoint_state(int epoch, const EpochProgress& progress) const;
  void write_checkpoint(const checkpoint::CheckpointState& state);

  // run_recovery.cpp: in-job recovery's change of membership, and a replacement's start.
  void change_membership(int epoch, EpochProgress& progress);
  bool be_taken_in();
  bool form_next_membership(const std::function<void()>& heal);
  std::optional<checkpoint::CheckpointState> heal(int epoch, const EpochProgress& progress);
  void use_communicator(comm::CommunicatorPtr communicator);

  // run_evaluation.cpp: the end of an epoch, and of the run.
  EpochMetrics evaluate_epoch(int epoch, const EpochProgress& progress);
  void write_report();

  LoopOptions options_;
  const LoopCallbacks& callbacks_;
  comm::CommunicatorPtr communicator_ptr_;
  comm::Communicator* communicator_;
  std::shared_ptr<comm::Membership> membership_;  // in-job recovery's; null without
  bool holds_state_;              // false in a replacement until a member healed it
  bool joined_in_epoch_ = false;  // a replacement, until its first epoch began
  int64_t heals_sent_ = 0;        // states this rank sent to members behind it
  int rank_, world_;
  bool is_main_;
  nn::ModelHolder model_;
  torch::nn::Module& module_;
  torch::optim::Optimizer& optimizer_;
  std::shared_ptr<const data::Dataset> train_set_, eval_set_;
  std::vector<double> user_lrs_;  // per param group, as fit() found them
  std::vector<double> base_lrs_;  // per param group, scaled by the global batch
  int64_t initial_batch_size_;    // per rank, where the run started: a checkpoint's, or ours
  int64_t initial_accumulate_batches_;  // batches per step where the run started: a checkpoint's, or ours
  CosineSchedule schedule_;       // of a unit rate: the factor every group's base is multiplied by
  std::optional<torch::ScalarType> autocast_dtype_;
  amp::GradScaler scaler_;        // disabled unless the precision scales the loss

  std::unique_ptr<ParallelStrategy> strategy_;  // the model wrapped, from wrap_model() on
  std::unique_ptr<data::BatchLoader> train_loader_, eval_loader_;
  std::unique_ptr<RunRecorder> records_;  // rank 0's
  std::unique_ptr<RunTimeline> run_timeline_;
  monitor::Timeline* timeline_ = nullptr;  // run_timeline_'s; null without one
  std::unique_ptr<ProgressReporter> progress_;
  checkpoint::CheckpointState resumed_;
  int64_t resumed_position_ = 0;  // where resumed_.epoch continues in its order
  checkpoint::RngStates rng_at_stop_;  // taken where max_steps stopped the run; undefined before
  // Rank 0's batches of an epoch from a position on (the same on every rank): an epoch's steps count them.
  std::optional<data::BatchSampler> first_rank_batches_;
  int64_t step_ = 0;
  bool stop_ = false;
};

}  // namespace tandem::train
