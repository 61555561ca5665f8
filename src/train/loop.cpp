// The training loop (train/loop.h): a Run's course, its epochs and its optimizer steps, top to bottom. The stages
// around them live beside it: its set-up in run_setup.cpp, checkpoints in run_checkpoints.cpp, evaluation in
// run_evaluation.cpp, the run dir in run_start.cpp, the loaders in training_loaders.cpp, each step's all-reduce in
// step_statistics.cpp, the model's strategy in strategies.cpp (docs/loop.md).
#include "tandem/train/loop.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "run.h"
#include "run_start.h"
#include "tandem/comm/process_group.h"
#include "tandem/comm/rank_agreement.h"
#include "tandem/data/data_agreement.h"
#include "tandem/ddp/join.h"
#include "tandem/util/compat.h"
#include "tandem/util/fault_injection.h"
#include "tandem/util/log.h"

namespace tandem::train {
namespace {

double unix_time() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

TrainResult Run::execute() {
  RunStart start;
  if (holds_state_) {
    start = start_run(options_, communicator_);
    options_.run_dir = start.run_dir;
    if (communicator_) {
      data::verify_ranks_hold_same_data(*communicator_, *train_set_, "training data");
      if (eval_set_) data::verify_ranks_hold_same_data(*communicator_, *eval_set_, "evaluation data");
    }
    if (callbacks_.on_run_start) {
      comm::run_on_all_ranks(communicator_, "at the run's start", [&] { callbacks_.on_run_start(options_.run_dir, start.checkpoint); });
    }
    wrap_model();
    if (!start.checkpoint.empty()) resume_from(start.checkpoint);
  } else if (!be_taken_in()) {
    // A lost worker's replacement: the run dir, the model and where training stands come from a member, unless
    // the run ended first.
    return {};
  }
  open_records(make_loaders());

  TrainResult result;
  result.run_dir = options_.run_dir;
  stop_ = steps_exhausted();
  for (int epoch = resumed_.epoch; epoch < options_.epochs && !stop_; ++epoch) {
    // The epoch's rate before its first step sets it: an epoch that a resume finds with no step left (a larger
    // global batch than the rest of its samples) still records the rate it trained at, not the optimizer's.
    set_lr(epoch);
    EpochProgress progress;
    if (epoch == resumed_.epoch && resumed_.batches_done > 0) {
      progress = progress_of(resumed_, resumed_position_);
    }
    progress = train_epoch(epoch, progress);
    result.epochs.push_back(evaluate_epoch(epoch, progress));
    const bool complete = !stop_ || progress.steps >= progress.steps_in_epoch;
    write_checkpoint(complete ? checkpoint_state(epoch + 1, {}) : checkpoint_state(epoch, progress));
  }
  // No replacement is taken in after the last step: one still starting would wait for nobody.
  if (membership_) membership_->close();
  if (run_timeline_) run_timeline_->finish(step_);
  strategy_->unwrap();
  if (options_.report) write_report();
  result.steps = step_;
  return result;
}

EpochProgress Run::train_epoch(int epoch, EpochProgress progress) {
  module_.train();
  if (callbacks_.on_epoch_start) {
    // A replacement taken in inside the epoch runs it alone: the others ran it when the epoch began.
    const auto call = [&] {
      callbacks_.on_epoch_start(epoch);
      strategy_->after_user_code();
    };
    if (joined_in_epoch_) {
      call();
    } else {
      comm::run_on_all_ranks(communicator_, "in on_epoch_start", call);
    }
  }
  joined_in_epoch_ = false;
  start_epoch_part(epoch, progress);
  // The bar counts to where max_steps stops the run, so that its ETA is the time to the stop.
  progress_->start_epoch(epoch, progress.batches_done,
                         options_.max_steps > 0 ? (options_.max_steps - step_) * options_.accumulate_batches : 0,
                         progress.batches_done + first_rank_batches_->num_batches());
  const auto start = std::chrono::steady_clock::now();
  const double earlier_seconds = progress.seconds;
  const auto seconds_so_far = [&] {
    return earlier_seconds + std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  // Under in-job recovery the epoch goes on in parts, one per membership (run_recovery.cpp): a collective that
  // fails for a lost rank, or a replacement announced at a step, ends a part, and the next goes on from the
  // newest step any member completed with the rest of the epoch's samples.
  while (true) {
    try {
      if (!train_epoch_part(epoch, progress, seconds_so_far)) break;
    } catch (const CommError& error) {
      if (!membership_) throw;
      log::warn("a collective failed ({}); going on with the ranks that are left", first_line(error.what()));
    }
    change_membership(epoch, progress);
    start_epoch_part(epoch, progress);
  }
  // Inside an epoch: the generators as the uninterrupted run has them after this step, before this run's
  // evaluation draws. At the epoch's end the uninterrupted run evaluates too, so the checkpoint takes the
  // generators after evaluation and on_epoch_end, as at every epoch end.
  if (stop_ && progress.steps < progress.steps_in_epoch) {
    rng_at_stop_ = checkpoint::gather_rng_states(communicator_, strategy_->devices());
  }
  progress.seconds = seconds_so_far();
  progress_->end_epoch();
  return progress;
}

// Inside a resumed epoch (or one whose membership changed) the loader starts where the batches done reach in the
// epoch's order, on this layout: the samples before are never loaded. The epoch's steps are those done and the
// ones its remaining batches make (rank 0's, the most under uneven inputs).
void Run::start_epoch_part(int epoch, EpochProgress& progress) {
  train_loader_->start_epoch(epoch, progress.first_position);
  first_rank_batches_->set_epoch(epoch, progress.first_position);
  const int64_t batches_left = first_rank_batches_->num_batches();
  progress.steps_in_epoch =
      progress.steps + (batches_left + options_.accumulate_batches - 1) / options_.accumulate_batches;
}

// The epoch's batches on this membership. Returns true when the membership is to change after the last step
// trained (the launcher announced a new one), false at the epoch's end or the run's.
bool Run::train_epoch_part(int epoch, EpochProgress& progress, const std::function<double()>& seconds_so_far) {
  // This rank's batches: under uneven inputs fewer than rank 0's on some ranks, which then shadow the rest.
  const int64_t batches_here = train_loader_->num_batches();
  const std::unique_ptr<ddp::Join> join = strategy_->join_uneven_inputs();
  std::vector<data::Batch> step_batches;
  while (std::optional<data::Batch> batch = train_loader_->next()) {
    step_batches.push_back(std::move(*batch));
    const int64_t wanted =
        std::min(options_.accumulate_batches, batches_here - (progress.batches_done - progress.first_batch));
    if (static_cast<int64_t>(step_batches.size()) < wanted) continue;
    const StepStatistics stats = train_step(epoch, progress.batches_done, step_batches);
    progress.batches_done += static_cast<int64_t>(step_batches.size());
    step_batches.clear();
    count_step(progress, stats);
    if (steps_exhausted()) {
      stop_ = true;
      break;
    }
    if (options_.checkpoint_every > 0 && step_ % options_.checkpoint_every == 0 &&
        progress.steps < progress.steps_in_epoch) {
      progress.seconds = seconds_so_far();
      write_checkpoint(checkpoint_state(epoch, progress));
    }
    if (membership_ && stats.announced_membership > membership_->epoch()) return true;
  }
  if (join) {
    compat::drop_gradients(optimizer_);
    join->finish([&] { count_step(progress, shadow_step(epoch, progress.batches_done)); });
  }
  // Every member agrees that the part ended here: one whose last step failed learns it now, not in evaluation.
  if (membership_) communicator_->barrier()->wait();
  return false;
}

// Every rank counts every step of the epoch, shadowed ones too, so that the epoch's metrics agree.
void Run::count_step(EpochProgress& progress, const StepStatistics& stats) {
  ++progress.steps;
  progress.loss_sum += stats.mean_loss();
  progress.samples += stats.samples;
  progress_->update(std::max<int64_t>(progress.batches_done - 1, 0), progress.loss_sum / progress.steps);
}

// One optimizer step on `batches` (accumulate_batches of them, fewer at an epoch's end): all but the last under
// DDP's no_sync, each loss divided by their count, so that the step's gradient is their mean. Returns what every
// rank learnt of the step.
StepStatistics Run::train_step(int epoch, int64_t batch_index, const std::vector<data::Batch>& batches) {
  fault::kill_point("step", step_ + 1);
  const auto start = std::chrono::steady_clock::now();
  if (timeline_) timeline_->begin_step(step_ + 1);
  set_lr(epoch);
  compat::drop_gradients(optimizer_);
  const auto count = static_cast<int64_t>(batches.size());
  torch::Tensor step_loss;
  int64_t samples = 0;
  for (int64_t i = 0; i < count; ++i) {
    const data::Batch& batch = batches[static_cast<size_t>(i)];
    const std::unique_ptr<LocalAccumulation> local_only = i + 1 < count ? strategy_->accumulate_locally() : nullptr;
    torch::Tensor loss;
    {
      monitor::TimelineSpan span(timeline_, monitor::SpanKind::kForward);
      loss = in_precision([&] {
        torch::Tensor output = strategy_->forward(batch.data);
        // Every sample of this rank's batch was unreadable (--skip-bad-images): a zero loss still runs backward,
        // so this rank joins the gradient all-reduce like the others (a mean over no rows would be NaN).
        return batch.size() > 0 ? options_.loss(output, batch.target) : output.sum() * 0.0;
      });
    }
    if (count > 1) loss = loss / static_cast<double>(count);
    if (fault::nan_loss_at(rank_, step_)) loss = loss * std::numeric_limits<float>::quiet_NaN();
    {
      monitor::TimelineSpan span(timeline_, monitor::SpanKind::kBackward);
      scaler_.scale(loss).backward();
    }
    step_loss = step_loss.defined() ? step_loss + loss.detach() : loss.detach();
    samples += batch.size();
  }
  const int64_t announced = membership_ && is_main_ ? membership_->newest_seen() : 0;
  const StepStatistics stats =
      reduce_step_statistics(step_loss, samples, seconds_since(start), rank_, communicator_, announced);
  if (!stats.nonfinite_ranks.empty()) {
    progress_->end_epoch();
    throw_nonfinite(stats, step_, epoch, batch_index);
  }
  complete_step(epoch, batch_index, stats, start);
  return stats;
}

// A rank out of batches under uneven inputs, after Join answered the others' backward: the reducer wrote that
// step's averaged gradient into .grad (ddp/join.h), and this rank steps its optimizer with it as the others do,
// so that its optimizer state (momentum, Adam's moments, the loss scale) stays theirs and so do its weights.
// The step is an empty one in its timeline, so that the timeline's window ends (a collective) at the same step
// everywhere.
StepStatistics Run::shadow_step(int epoch, int64_t batch_index) {
  const auto start = std::chrono::steady_clock::now();
  if (timeline_) timeline_->begin_step(step_ + 1);
  set_lr(epoch);
  const StepStatistics stats = reduce_step_statistics(torch::Tensor(), 0, 0.0, rank_, communicator_);
  if (!stats.nonfinite_ranks.empty()) throw_nonfinite(stats, step_ + 1, epoch, batch_index);
  complete_step(epoch, batch_index, stats, start);
  compat::drop_gradients(optimizer_);
  return stats;
}

// The optimizer's step on the synchronised gradients, and what follows it on every rank.
void Run::complete_step(int epoch, int64_t batch_index, const StepStatistics& stats,
                        std::chrono::steady_clock::time_point start) {
  bool stepped = false;
  // A step without a sample on any rank (every image of its batches unreadable, under skip_bad_images) has a zero
  // gradient everywhere, and stepping on it would still move the weights by momentum and weight decay: the
  // optimizer and the scaler leave it, as the scaler leaves a step that overflowed. The count is every rank's.
  if (stats.samples > 0) {
    monitor::TimelineSpan span(timeline_, monitor::SpanKind::kOptimizer);
    stepped = strategy_->step([&] { return scaler_.step(optimizer_); });
    scaler_.update();
  }
  ++step_;
  if (timeline_) timeline_->end_step();
  const double mean_loss = stats.mean_loss();
  const double lr = optimizer_.param_groups()[0].options().get_lr();
  if (records_) {
    const double seconds = seconds_since(start);
    records_->record_step({step_, epoch, batch_index, mean_loss, lr, scaler_.get_scale(), stepped, seconds,
                           seconds > 0 ? stats.samples / seconds : 0.0, stats.samples, world_, unix_time(), stats.rank_seconds});
  }
  if (run_timeline_) run_timeline_->after_step(step_);
  if (callbacks_.on_step) {
    callbacks_.on_step({epoch, batch_index, step_, mean_loss, lr, stepped, scaler_.get_scale()});
    strategy_->after_user_code();
  }
}

// A step's global batch (every rank's batches of the step) over the per-rank step batch the run started with.
void Run::scale_base_lrs() {
  const double scale = options_.scale_lr_by_world_size
                           ? static_cast<double>(world_ * options_.batch_size * options_.accumulate_batches) /
                                 (initial_batch_size_ * initial_accumulate_batches_)
                           : 1.0;
  base_lrs_.clear();
  for (double lr : user_lrs_) base_lrs_.push_back(lr * scale);
}

int64_t Run::position_done(const EpochProgress& progress) const {
  const int64_t trained = (progress.batches_done - progress.first_batch) * options_.batch_size * world_;
  return std::min(progress.first_position + trained, train_set_->size());
}

void Run::set_lr(int epoch) {
  const double factor = schedule_.factor(epoch) * schedule_.warmup_factor(step_);
  auto& groups = optimizer_.param_groups();
  for (size_t g = 0; g < groups.size(); ++g) groups[g].options().set_lr(base_lrs_[g] * factor);
}

Loop::Loop(LoopOptions options) : options_(std::move(options)), use_default_group_(true) {}

Loop::Loop(LoopOptions options, comm::CommunicatorPtr communicator)
    : options_(std::move(options)), communicator_(std::move(communicator)) {}

comm::CommunicatorPtr Loop::resolve_group() const {
  if (!use_default_group_) return communicator_;
  if (comm::CommunicatorPtr group = default_communicator()) return group;
  // Under a launcher each process would otherwise train alone as rank 0, all of them into one run dir.
  const char* world_size = std::getenv("WORLD_SIZE");
  if (world_size && std::atoi(world_size) > 1) {
    throw InvalidArgument(fmt::format("WORLD_SIZE is {} but no process group is initialised: call "
                                      "tandem::init_process_group() before Loop::fit",
                                      world_size));
  }
  return nullptr;
}

std::shared_ptr<comm::Membership> Loop::resolve_membership() const {
  if (!options_.in_job_recovery) return nullptr;
  if (!is_initialized() || !default_group().membership()) {
    throw InvalidArgument("`in_job_recovery` needs a process group that holds the job's membership, which tandem "
                          "run gives its workers under in-job recovery; this process's has none");
  }
  return default_group().membership();
}

TrainResult Loop::fit(nn::ModelHolder model, torch::optim::Optimizer& optimizer,
                      std::shared_ptr<const data::Dataset> train_set, std::shared_ptr<const data::Dataset> eval_set) {
  return fit(make_parallel_strategy(options_), std::move(model), optimizer, std::move(train_set), std::move(eval_set));
}

TrainResult Loop::fit(nn::ModelHolder model, optim::ZeroRedundancyOptimizer& optimizer,
                      std::shared_ptr<const data::Dataset> train_set, std::shared_ptr<const data::Dataset> eval_set) {
  return fit(make_parallel_strategy(options_, &optimizer), std::move(model), optimizer, std::move(train_set),
             std::move(eval_set));
}

TrainResult Loop::fit(std::unique_ptr<ParallelStrategy> strategy, nn::ModelHolder model,
                      torch::optim::Optimizer& optimizer, std::shared_ptr<const data::Dataset> train_set,
                      std::shared_ptr<const data::Dataset> eval_set) {
  if (!strategy) throw InvalidArgument("Loop::fit was given a null strategy");
  std::shared_ptr<comm::Membership> membership = resolve_membership();
  Run run(options_, callbacks_, membership ? membership->communicator() : resolve_group(), membership,
          std::move(strategy), std::move(model), optimizer, std::move(train_set), std::move(eval_set));
  return run.execute();
}

}  // namespace tandem::train
