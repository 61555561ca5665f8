// The training loop (train/loop.h): a Run's start, its epochs and its optimizer steps, top to bottom. The stages
// around them live beside it: checkpoints in run_checkpoints.cpp, evaluation in run_evaluation.cpp, the run dir
// in run_start.cpp, the loaders in training_loaders.cpp, each step's all-reduce in step_statistics.cpp
// (docs/loop.md).
#include "tandem/train/loop.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "run.h"
#include "run_start.h"
#include "training_loaders.h"
#include "tandem/comm/process_group.h"
#include "tandem/comm/rank_agreement.h"
#include "tandem/data/data_agreement.h"
#include "tandem/ddp/join.h"
#include "tandem/ddp/named_comm_hook.h"
#include "tandem/ddp/no_sync_guard.h"
#include "tandem/fsdp/full_state_view.h"
#include "tandem/fsdp/unused_parameters.h"
#include "tandem/util/compat.h"
#include "tandem/util/fault_injection.h"
#include "tandem/util/log.h"

namespace tandem::train {
namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

amp::GradScalerOptions scaler_options(const LoopOptions& options) {
  amp::GradScalerOptions scaler = options.grad_scaler;
  scaler.enabled = amp::uses_loss_scaling(options.precision);
  return scaler;
}

int world_size_of(const comm::CommunicatorPtr& communicator) { return communicator ? communicator->world_size() : 1; }

// LibTorch's Module::parameters() lists a tensor registered in two modules (a tied weight) under each of its
// names, where PyTorch's lists it once: an optimizer built over it would step that tensor twice a step, and its
// archive, holding the tensor twice, loads back a null state for it (a crash in the next step after a resume).
void require_each_tensor_once(const torch::optim::Optimizer& optimizer, const torch::nn::Module& module) {
  std::map<const void*, std::vector<std::string>> names;
  for (const auto& item : module.named_parameters()) names[item.value().unsafeGetTensorImpl()].push_back(item.key());
  std::set<const void*> held;
  for (const auto& group : optimizer.param_groups()) {
    for (const auto& parameter : group.params()) {
      if (held.insert(parameter.unsafeGetTensorImpl()).second) continue;
      const std::vector<std::string>& its = names[parameter.unsafeGetTensorImpl()];
      throw InvalidArgument(fmt::format(
          "the optimizer holds {} twice{}: build the optimizer over each tensor once (Module::parameters() lists "
          "a tensor registered in two modules, a tied weight, under each of its names)",
          its.empty() ? "a tensor" : fmt::format("the model's '{}'", its.front()),
          its.size() < 2 ? "" : fmt::format(" (it is '{}' too)", fmt::join(its.begin() + 1, its.end(), "', '"))));
    }
  }
}

// Checked before any member is built from them: the schedule and the scaler take the options as valid.
const LoopOptions& validated(const LoopOptions& options, int world_size) {
  validate(options, world_size);
  return options;
}

}  // namespace

Run::Run(const LoopOptions& options, const LoopCallbacks& callbacks, comm::CommunicatorPtr communicator,
         nn::ModelHolder model, torch::optim::Optimizer& optimizer, optim::ZeroRedundancyOptimizer* sharded,
         std::shared_ptr<const data::Dataset> train_set, std::shared_ptr<const data::Dataset> eval_set)
    : options_(validated(options, world_size_of(communicator))),
      callbacks_(callbacks),
      communicator_ptr_(std::move(communicator)),
      communicator_(communicator_ptr_.get()),
      rank_(communicator_ ? communicator_->rank() : 0),
      world_(world_size_of(communicator_ptr_)),
      is_main_(rank_ == 0),
      model_(std::move(model)),
      module_(*model_),
      optimizer_(optimizer),
      sharded_(sharded),
      train_set_(std::move(train_set)),
      eval_set_(std::move(eval_set)),
      initial_batch_size_(options_.batch_size),
      initial_accumulate_batches_(options_.accumulate_batches),
      schedule_(1.0, options.lrf, options.epochs, options.warmup_steps),
      autocast_dtype_(amp::autocast_dtype(options.precision)),
      scaler_(scaler_options(options), communicator_ptr_) {
  if (!train_set_) throw InvalidArgument("Loop::fit needs a training set");
  // An evaluation set of no samples (an image folder split with a val_split of 0) has no accuracy to give: the
  // run trains as one without an evaluation set, and says so once, rather than report 0 correct of 0 each epoch.
  if (eval_set_ && eval_set_->size() == 0) {
    log::main_info("the evaluation set holds no samples: the epochs report their training loss only");
    eval_set_.reset();
  }
  for (auto& group : optimizer_.param_groups()) user_lrs_.push_back(group.options().get_lr());
  if (user_lrs_.empty()) throw InvalidArgument("the optimizer holds no parameters");
  require_each_tensor_once(optimizer_, module_);
  scale_base_lrs();
  if (autocast_dtype_) amp::require_autocast(options_.device, *autocast_dtype_);
  if (options_.uneven_inputs) ddp::Join::require_joinable(module_);
}

// The schedule wrote scaled and decayed rates into the optimizer; the user's own come back, so that another
// fit() on the same optimizer starts from them instead of compounding the scaling.
Run::~Run() {
  auto& groups = optimizer_.param_groups();
  for (size_t g = 0; g < groups.size() && g < user_lrs_.size(); ++g) groups[g].options().set_lr(user_lrs_[g]);
}

TrainResult Run::execute() {
  const RunStart start = start_run(options_, communicator_);
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
  TrainingLoaders loaders = make_training_loaders(options_, rank_, world_, train_set_, eval_set_);
  train_loader_ = std::move(loaders.train);
  eval_loader_ = std::move(loaders.eval);
  first_rank_batches_ = std::move(loaders.first_rank);
  open_records(loaders.batches_per_epoch);

  TrainResult result;
  result.run_dir = options_.run_dir;
  stop_ = steps_exhausted();
  for (int epoch = resumed_.epoch; epoch < options_.epochs && !stop_; ++epoch) {
    // The epoch's rate before its first step sets it: an epoch that a resume finds with no step left (a larger
    // global batch than the rest of its samples) still records the rate it trained at, not the optimizer's.
    set_lr(epoch);
    EpochProgress progress;
    if (epoch == resumed_.epoch && resumed_.batches_done > 0) {
      progress = {resumed_.batches_done, resumed_.epoch_loss_sum, resumed_.epoch_steps, resumed_.epoch_samples,
                  resumed_.epoch_train_seconds, resumed_position_, resumed_.batches_done};
    }
    progress = train_epoch(epoch, progress);
    result.epochs.push_back(evaluate_epoch(epoch, progress));
    const bool complete = !stop_ || progress.steps >= progress.steps_in_epoch;
    write_checkpoint(complete ? checkpoint_state(epoch + 1, {}) : checkpoint_state(epoch, progress));
  }
  if (run_timeline_) run_timeline_->finish(step_);
  if (fsdp_model_) unshard_model();
  if (options_.report) write_report();
  result.steps = step_;
  return result;
}

// Onto the rank's device before DDP forms its buckets next to the gradients (Module::to moves the parameters'
// data in place, so the optimizer's references stay valid), then into DDP, DataParallel or FSDP; under FSDP the
// optimizer steps the shards from here to the run's end.
void Run::wrap_model() {
  module_.to(options_.device);
  if (options_.strategy == Strategy::kDataParallel) {
    dp_model_ = std::make_unique<dp::DataParallel>(model_, dp::DataParallelOptions{
        options_.dp_devices.empty() ? dp::replica_devices(options_.device, 0) : options_.dp_devices, {}});
    return;
  }
  if (options_.strategy == Strategy::kFsdp) {
    fsdp::require_fsdp_optimizer(optimizer_, module_);
    fsdp::FsdpOptions fsdp_options = options_.fsdp;
    // bf16-mixed and 16-mixed compute on bfloat16 and float16 parameters gathered from float32 shards; gradients
    // are reduced in float32, so the ranks' sum rounds no further than DDP's (docs/fsdp.md, "Mixed precision").
    // Autocast (in_precision) still runs around the forward, for the losses and norms it keeps in float32.
    if (autocast_dtype_) {
      fsdp_options.mixed_precision.param_dtype = *autocast_dtype_;
      fsdp_options.mixed_precision.reduce_dtype = torch::kFloat32;
    }
    fsdp_model_ = std::make_unique<fsdp::FullyShardedDataParallel<nn::ModelHolder>>(model_, communicator_ptr_,
                                                                                     fsdp_options);
    fsdp::shard_optimizer(fsdp_model_->sharded(), module_, optimizer_);
    return;
  }
  if (communicator_ && world_ > 1) ddp::require_backend_reduces(options_.comm_hook, *communicator_);
  ddp::DdpOptions ddp_options;
  ddp_options.check_replicas_every = options_.check_replicas_every;
  ddp_options.bucket_plan = ddp::BucketPlan::kAdaptToHost;
  ddp_options.comm_hook = ddp::make_comm_hook(options_.comm_hook, options_.powersgd);
  ddp_model_ = std::make_unique<ddp::DistributedDataParallel<nn::ModelHolder>>(model_, communicator_ptr_, ddp_options);
}

// The caller gets its model and optimizer back as DDP leaves them: full parameters (the same on every rank), and
// the optimizer over them with the whole state.
void Run::unshard_model() {
  fsdp::FullStateView(fsdp_model_->sharded(), module_, optimizer_).keep();
  fsdp_model_.reset();
}

// Rank 0's records, the timeline and the progress bar.
void Run::open_records(int64_t batches_per_epoch) {
  comm::run_on_all_ranks(communicator_, "to open the run's records", [&] {
    if (is_main_) {
      records_ = std::make_unique<RunRecorder>(options_.run_dir, resumed_.epoch, resumed_.step,
                                              RunRecorderOptions{options_.tensorboard, eval_set_ != nullptr});
    }
  });
  if (!options_.timeline_path.empty()) {
    run_timeline_ = std::make_unique<RunTimeline>(options_.timeline_path, options_.timeline_steps, options_.run_dir,
                                                  communicator_, ddp_model_ ? &ddp_model_->reducer() : nullptr);
    timeline_ = run_timeline_->timeline();
  }
  ProgressOptions progress_options;
  progress_options.enabled = is_main_ && options_.progress;
  progress_ = std::make_unique<ProgressReporter>(batches_per_epoch, options_.batch_size * world_, progress_options);
}

EpochProgress Run::train_epoch(int epoch, EpochProgress progress) {
  module_.train();
  if (callbacks_.on_epoch_start) {
    comm::run_on_all_ranks(communicator_, "in on_epoch_start", [&] {
      callbacks_.on_epoch_start(epoch);
      refuse_placeholder_reads();
    });
  }
  // Inside a resumed epoch the loader starts where the checkpoint's batches reach in the epoch's order, on this
  // run's layout: the samples before are never loaded. The epoch's steps are those before the resume and the
  // ones its remaining batches make (rank 0's, the most under uneven inputs).
  train_loader_->start_epoch(epoch, progress.first_position);
  first_rank_batches_->set_epoch(epoch, progress.first_position);
  const int64_t batches_left = first_rank_batches_->num_batches();
  progress.steps_in_epoch =
      progress.steps + (batches_left + options_.accumulate_batches - 1) / options_.accumulate_batches;
  // The bar counts to where max_steps stops the run, so that its ETA is the time to the stop.
  progress_->start_epoch(epoch, progress.batches_done,
                         options_.max_steps > 0 ? (options_.max_steps - step_) * options_.accumulate_batches : 0,
                         progress.batches_done + batches_left);
  const auto start = std::chrono::steady_clock::now();
  const double earlier_seconds = progress.seconds;
  const auto seconds_so_far = [&] {
    return earlier_seconds + std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  // This rank's batches: under uneven inputs fewer than rank 0's on some ranks, which then shadow the rest.
  const int64_t batches_here = train_loader_->num_batches();
  std::optional<ddp::Join> join;
  if (options_.uneven_inputs && ddp_model_) join.emplace(*ddp_model_);
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
  }
  if (join) {
    compat::drop_gradients(optimizer_);
    join->finish([&] { count_step(progress, shadow_step(epoch, progress.batches_done)); });
  }
  // Inside an epoch: the generators as the uninterrupted run has them after this step, before this run's
  // evaluation draws. At the epoch's end the uninterrupted run evaluates too, so the checkpoint takes the
  // generators after evaluation and on_epoch_end, as at every epoch end.
  if (stop_ && progress.steps < progress.steps_in_epoch) {
    rng_at_stop_ = checkpoint::gather_rng_states(communicator_, rng_devices());
  }
  progress.seconds = seconds_so_far();
  progress_->end_epoch();
  return progress;
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
    std::optional<ddp::NoSyncGuard> local_only;
    std::optional<fsdp::NoSyncGuard> shards_local_only;
    if (ddp_model_ && i + 1 < count) local_only.emplace(ddp_model_->reducer());
    if (fsdp_model_ && i + 1 < count) shards_local_only.emplace(fsdp_model_->no_sync());
    torch::Tensor loss;
    {
      monitor::TimelineSpan span(timeline_, monitor::SpanKind::kForward);
      loss = in_precision([&] {
        torch::Tensor output = forward_for_training(batch.data);
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
  const StepStatistics stats = reduce_step_statistics(step_loss, samples, seconds_since(start), rank_, communicator_);
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
  {
    monitor::TimelineSpan span(timeline_, monitor::SpanKind::kOptimizer);
    if (fsdp_model_) {
      fsdp::step_leaving_unused(fsdp_model_->sharded(), optimizer_, [&] { stepped = scaler_.step(optimizer_); });
    } else {
      stepped = scaler_.step(optimizer_);
    }
    scaler_.update();
  }
  ++step_;
  if (timeline_) timeline_->end_step();
  const double mean_loss = stats.mean_loss();
  const double lr = optimizer_.param_groups()[0].options().get_lr();
  if (records_) {
    const double seconds = seconds_since(start);
    records_->record_step({step_, epoch, batch_index, mean_loss, lr, scaler_.get_scale(), stepped, seconds,
                           seconds > 0 ? stats.samples / seconds : 0.0, stats.rank_seconds});
  }
  if (run_timeline_) run_timeline_->after_step(step_);
  if (callbacks_.on_step) {
    callbacks_.on_step({epoch, batch_index, step_, mean_loss, lr, stepped, scaler_.get_scale()});
    refuse_placeholder_reads();
  }
}

void Run::refuse_placeholder_reads() {
  if (fsdp_model_) fsdp_model_->sharded().rethrow_failure();
}

torch::Tensor Run::forward_for_training(const torch::Tensor& x) {
  if (fsdp_model_) return fsdp_model_->forward(x);
  if (!dp_model_) return ddp_model_->forward(x);
  // DataParallel splits the rows; a batch of none (every image unreadable) goes through the model itself.
  return x.size(0) > 0 ? dp_model_->forward(x) : model_.forward(x);
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
  if (is_initialized()) return default_group().communicator_ptr();
  // Under a launcher each process would otherwise train alone as rank 0, all of them into one run dir.
  const char* world_size = std::getenv("WORLD_SIZE");
  if (world_size && std::atoi(world_size) > 1) {
    throw InvalidArgument(fmt::format("WORLD_SIZE is {} but no process group is initialised: call "
                                      "tandem::init_process_group() before Loop::fit",
                                      world_size));
  }
  return nullptr;
}

TrainResult Loop::fit(nn::ModelHolder model, torch::optim::Optimizer& optimizer,
                      std::shared_ptr<const data::Dataset> train_set, std::shared_ptr<const data::Dataset> eval_set) {
  return run(std::move(model), optimizer, nullptr, std::move(train_set), std::move(eval_set));
}

TrainResult Loop::fit(nn::ModelHolder model, optim::ZeroRedundancyOptimizer& optimizer,
                      std::shared_ptr<const data::Dataset> train_set, std::shared_ptr<const data::Dataset> eval_set) {
  return run(std::move(model), optimizer, &optimizer, std::move(train_set), std::move(eval_set));
}

TrainResult Loop::run(nn::ModelHolder model, torch::optim::Optimizer& optimizer, optim::ZeroRedundancyOptimizer* sharded,
                      std::shared_ptr<const data::Dataset> train_set, std::shared_ptr<const data::Dataset> eval_set) {
  Run run(options_, callbacks_, resolve_group(), std::move(model), optimizer, sharded, std::move(train_set),
          std::move(eval_set));
  return run.execute();
}

}  // namespace tandem::train
