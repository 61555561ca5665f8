#include "tandem/train/loop.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <optional>
#include <vector>

#include "tandem/amp/autocast.h"
#include "tandem/comm/process_group.h"
#include "tandem/comm/rank_agreement.h"
#include "tandem/comm/value_collectives.h"
#include "tandem/data/batch_loader.h"
#include "tandem/data/data_agreement.h"
#include "tandem/data/distributed_sampler.h"
#include "tandem/ddp/distributed_data_parallel.h"
#include "tandem/ddp/join.h"
#include "tandem/ddp/named_comm_hook.h"
#include "tandem/ddp/no_sync_guard.h"
#include "tandem/dp/data_parallel.h"
#include "tandem/nn/model_holder.h"
#include "tandem/optim/zero_redundancy_optimizer.h"
#include "tandem/train/evaluation.h"
#include "tandem/train/lr_schedule.h"
#include "tandem/train/progress.h"
#include "tandem/train/run_directory.h"
#include "tandem/train/run_recorder.h"
#include "tandem/train/run_timeline.h"
#include "tandem/util/compat.h"
#include "tandem/util/fault_injection.h"
#include "tandem/util/log.h"

namespace tandem::train {
namespace {

struct NanInjection {
  int rank = -1;
  int64_t step = -1;
};

// TANDEM_INJECT_NAN_AT_STEP=RANK:STEP (test hook, see loop.h).
NanInjection nan_injection_from_env() {
  NanInjection injection;
  const char* value = std::getenv("TANDEM_INJECT_NAN_AT_STEP");
  if (!value) return injection;
  long long step = -1;
  if (std::sscanf(value, "%d:%lld", &injection.rank, &step) != 2) {
    throw InvalidArgument(std::string("TANDEM_INJECT_NAN_AT_STEP must be RANK:STEP, got '") + value + "'");
  }
  injection.step = step;
  return injection;
}

// What each step's one all-reduce tells every rank, read on the host.
struct StepStatistics {
  double loss_sum = 0;            // of the finite losses
  int trained_ranks = 0;          // fewer than the world when some ranks ran out of data (uneven inputs)
  int64_t samples = 0;            // in this step's batches over every rank: partial batches count what they hold
  std::vector<int> nonfinite_ranks;
  std::vector<double> rank_seconds;

  double mean_loss() const { return trained_ranks > 0 ? loss_sum / trained_ranks : 0.0; }
};

// Built on the loss's device as [loss sum, trained ranks, samples, a non-finite flag per rank, seconds per rank],
// so the step costs one all-reduce and one read for the metric, the NaN check, the throughput and the ranks'
// timings. A rank that shadows the step (no loss) passes an undefined loss and no samples.
StepStatistics reduce_step_statistics(const torch::Tensor& loss, int64_t samples, double seconds, int rank,
                                      comm::Communicator* communicator) {
  const int world = communicator ? communicator->world_size() : 1;
  const torch::TensorOptions options =
      torch::TensorOptions().dtype(torch::kFloat64).device(loss.defined() ? loss.device() : torch::kCPU);
  torch::Tensor stats = torch::zeros({3 + 2 * world}, options);
  if (loss.defined()) {
    torch::Tensor value = loss.detach().to(torch::kFloat64).reshape({1});
    torch::Tensor finite = torch::isfinite(value);
    stats.narrow(0, 0, 1).copy_(torch::where(finite, value, torch::zeros_like(value)));
    stats.narrow(0, 1, 1).fill_(1.0);
    stats.narrow(0, 3 + rank, 1).copy_(finite.logical_not().to(torch::kFloat64));
  }
  stats.narrow(0, 2, 1).fill_(static_cast<double>(samples));
  stats.narrow(0, 3 + world + rank, 1).fill_(seconds);
  if (world > 1) comm::all_reduce_values(*communicator, stats, comm::ReduceOp::Sum);
  const torch::Tensor host = stats.cpu();
  const double* values = host.data_ptr<double>();
  StepStatistics result;
  result.loss_sum = values[0];
  result.trained_ranks = static_cast<int>(std::lround(values[1]));
  result.samples = std::llround(values[2]);
  for (int r = 0; r < world; ++r) {
    if (values[3 + r] > 0) result.nonfinite_ranks.push_back(r);
    result.rank_seconds.push_back(values[3 + world + r]);
  }
  return result;
}

[[noreturn]] void throw_nonfinite(const StepStatistics& stats, int64_t step, int epoch, int64_t batch_index) {
  throw NonFiniteLossError(fmt::format(
      "non-finite loss on rank{} {} at step {} (epoch {}, batch {}); stopping all ranks. Try a lower --lr.",
      stats.nonfinite_ranks.size() > 1 ? "s" : "", fmt::join(stats.nonfinite_ranks, ","), step, epoch, batch_index));
}

// Every attempt of a job under tandem run (or torchrun with --rdzv-id) shares TORCHELASTIC_RUN_ID, so its run
// dir runs/<id> is where a restarted attempt finds the first one's checkpoints. Empty outside a launcher, and for
// torchrun's default id "none", which names no job.
std::string launcher_run_dir() {
  const char* run_id = std::getenv("TORCHELASTIC_RUN_ID");
  if (!run_id || !*run_id || std::string(run_id) == "none") return "";
  return std::string("runs/") + run_id;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

amp::GradScalerOptions scaler_options(const LoopOptions& options) {
  amp::GradScalerOptions scaler = options.grad_scaler;
  scaler.enabled = amp::uses_loss_scaling(options.precision);
  return scaler;
}

// Where an epoch's training stands: restored from a checkpoint taken inside it, or from zero.
struct EpochProgress {
  int64_t batches_done = 0;
  double loss_sum = 0;  // of the per-step losses averaged over ranks
  int64_t steps = 0;
  int64_t samples = 0;  // trained on, over every rank
  double seconds = 0;  // training time, before a resume included
};

// One call of Loop::fit: the model wrapped for the run, its loaders and writers, and where training stands.
class Run {
 public:
  Run(const LoopOptions& options, const LoopCallbacks& callbacks, comm::CommunicatorPtr communicator,
      nn::ModelHolder model, torch::optim::Optimizer& optimizer, std::shared_ptr<const data::Dataset> train_set,
      std::shared_ptr<const data::Dataset> eval_set);
  ~Run();
  Run(const Run&) = delete;
  Run& operator=(const Run&) = delete;

  TrainResult execute();

 private:
  std::string prepare_run_dir();
  void resume_from(const std::string& checkpoint);
  int64_t make_loaders();
  EpochProgress train_epoch(int epoch, EpochProgress progress);
  StepStatistics train_step(int epoch, int64_t batch_index, const std::vector<data::Batch>& batches);
  StepStatistics shadow_step(int epoch, int64_t batch_index);
  void complete_step(int epoch, int64_t batch_index, const StepStatistics& stats,
                     std::chrono::steady_clock::time_point start);
  void count_step(EpochProgress& progress, const StepStatistics& stats);
  EpochMetrics evaluate_epoch(int epoch, const EpochProgress& progress);
  void set_lr(int epoch);
  CheckpointState checkpoint_state(int epoch, const EpochProgress& progress) const;
  void write_checkpoint(const CheckpointState& state);
  void write_report();
  bool steps_exhausted() const { return options_.max_steps > 0 && step_ >= options_.max_steps; }
  // The devices whose generators a checkpoint holds: every DataParallel replica's, else the rank's own.
  std::vector<torch::Device> rng_devices() const {
    return dp_model_ ? dp_model_->devices() : std::vector<torch::Device>{options_.device};
  }
  // Runs `pass` (a forward, and the loss) under the run's autocast, if it has one.
  template <typename Pass>
  auto in_precision(Pass&& pass) {
    std::optional<amp::Autocast> autocast;
    if (autocast_dtype_) autocast.emplace(options_.device.type(), *autocast_dtype_);
    return pass();
  }

  LoopOptions options_;
  const LoopCallbacks& callbacks_;
  comm::CommunicatorPtr communicator_ptr_;
  comm::Communicator* communicator_;
  int rank_, world_;
  bool is_main_;
  nn::ModelHolder model_;
  torch::nn::Module& module_;
  torch::optim::Optimizer& optimizer_;
  std::shared_ptr<const data::Dataset> train_set_, eval_set_;
  NanInjection injection_ = nan_injection_from_env();
  std::vector<double> user_lrs_;  // per param group, as fit() found them
  std::vector<double> base_lrs_;  // per param group, world-size-scaled
  CosineSchedule schedule_;       // of a unit rate: the factor every group's base is multiplied by
  std::optional<torch::ScalarType> autocast_dtype_;
  amp::GradScaler scaler_;        // disabled unless the precision scales the loss
  torch::Tensor forward_for_training(const torch::Tensor& x);

  std::unique_ptr<ddp::DistributedDataParallel<nn::ModelHolder>> ddp_model_;  // Strategy::kDdp
  std::unique_ptr<dp::DataParallel> dp_model_;                                 // Strategy::kDataParallel
  std::unique_ptr<data::BatchLoader> train_loader_, eval_loader_;
  std::unique_ptr<RunRecorder> records_;  // rank 0's
  std::unique_ptr<RunTimeline> run_timeline_;
  monitor::Timeline* timeline_ = nullptr;  // run_timeline_'s; null without one
  std::unique_ptr<ProgressReporter> progress_;
  CheckpointState resumed_;
  RngStates rng_at_stop_;  // taken where max_steps stopped the run; undefined before
  int64_t steps_per_epoch_ = 0;  // the same on every rank: rank 0's batches, accumulate_batches to a step
  int64_t step_ = 0;
  bool stop_ = false;
};

Run::Run(const LoopOptions& options, const LoopCallbacks& callbacks, comm::CommunicatorPtr communicator,
         nn::ModelHolder model, torch::optim::Optimizer& optimizer, std::shared_ptr<const data::Dataset> train_set,
         std::shared_ptr<const data::Dataset> eval_set)
    : options_(options),
      callbacks_(callbacks),
      communicator_ptr_(std::move(communicator)),
      communicator_(communicator_ptr_.get()),
      rank_(communicator_ ? communicator_->rank() : 0),
      world_(communicator_ ? communicator_->world_size() : 1),
      is_main_(rank_ == 0),
      model_(std::move(model)),
      module_(*model_),
      optimizer_(optimizer),
      train_set_(std::move(train_set)),
      eval_set_(std::move(eval_set)),
      schedule_(1.0, options.lrf, options.epochs, options.warmup_steps),
      autocast_dtype_(amp::autocast_dtype(options.precision)),
      scaler_(scaler_options(options), communicator_ptr_) {
  if (options_.epochs < 1) throw InvalidArgument(fmt::format("epochs must be at least 1, not {}", options_.epochs));
  if (options_.batch_size < 1) throw InvalidArgument(fmt::format("batch size must be at least 1, not {}", options_.batch_size));
  if (options_.warmup_steps < 0) throw InvalidArgument("warmup steps must not be negative");
  // A fraction of the rate: below 0 the schedule would turn the rate negative (gradient ascent), above 1 raise it.
  if (!(options_.lrf >= 0 && options_.lrf <= 1)) {
    throw InvalidArgument(fmt::format("lrf (the final rate as a fraction of the first) must be between 0 and 1, not {}", options_.lrf));
  }
  if (!train_set_) throw InvalidArgument("Loop::fit needs a training set");
  if (!options_.loss) throw InvalidArgument("LoopOptions::loss is empty");
  const double scale = options_.scale_lr_by_world_size ? world_ : 1;
  for (auto& group : optimizer_.param_groups()) {
    user_lrs_.push_back(group.options().get_lr());
    base_lrs_.push_back(user_lrs_.back() * scale);
  }
  if (base_lrs_.empty()) throw InvalidArgument("the optimizer holds no parameters");
  if (autocast_dtype_) amp::require_autocast(options_.device, *autocast_dtype_);
  if (options_.accumulate_batches < 1) {
    throw InvalidArgument(fmt::format("accumulate batches must be at least 1, not {}", options_.accumulate_batches));
  }
  ddp::require_comm_hook_name(options_.comm_hook);
  if (options_.strategy == Strategy::kDataParallel && options_.comm_hook != "average") {
    throw InvalidArgument(fmt::format("--comm-hook {} shapes DDP's all-reduce between processes, and DataParallel "
                                      "reduces inside one process: drop --comm-hook, or use --strategy ddp",
                                      options_.comm_hook));
  }
  if (options_.uneven_inputs) {
    const char* conflict =
        options_.strategy == Strategy::kDataParallel ? "--strategy dp (one process has no uneven ranks)"
        : options_.max_steps > 0                     ? "--steps (ranks stop at different batches)"
        : options_.checkpoint_every > 0 ? "--checkpoint-every (ranks stand at different batches inside an epoch)"
        : options_.comm_hook == "powersgd"
            ? "--comm-hook powersgd (a rank out of data still sends its error feedback, so the mean over the ranks "
              "that trained is not exact)"
            : nullptr;
    if (conflict) throw InvalidArgument(fmt::format("--uneven cannot be combined with {}; drop one of them", conflict));
    ddp::Join::require_joinable(module_);
  }
  if (options_.strategy == Strategy::kDataParallel && world_ > 1) {
    throw InvalidArgument(fmt::format("strategy dp (DataParallel) trains in one process, but this is one of {}: "
                                      "use ddp under tandem run, or start a single process",
                                      world_));
  }
}

// The schedule wrote scaled and decayed rates into the optimizer; the user's own come back, so that another
// fit() on the same optimizer starts from them instead of compounding the scaling.
Run::~Run() {
  auto& groups = optimizer_.param_groups();
  for (size_t g = 0; g < groups.size() && g < user_lrs_.size(); ++g) groups[g].options().set_lr(user_lrs_[g]);
}

std::string Run::prepare_run_dir() {
  std::string checkpoint;
  comm::run_on_all_ranks(communicator_, "to prepare the run directory", [&] {
    if (!is_main_) return;
    if (options_.run_dir.empty() && !options_.resume && options_.continue_launcher_run) {
      options_.run_dir = launcher_run_dir();
    }
    if (options_.run_dir.empty()) options_.run_dir = options_.resume ? newest_run_dir("runs") : timestamped_run_dir();
    if (options_.run_dir.empty()) throw InvalidArgument("--resume: no run under runs/ holds a checkpoint; pass --run-dir");
    // A damaged newest checkpoint (a crash of the storage, a copy cut short) is reported and skipped.
    auto latest = find_latest_intact_checkpoint(options_.run_dir);
    if (options_.resume && !latest) throw InvalidArgument("--resume: no checkpoint in " + options_.run_dir);
    if (latest) checkpoint = *latest;
    std::error_code error;
    std::filesystem::create_directories(options_.run_dir, error);
    if (error) throw Error("cannot create the run directory " + options_.run_dir + ": " + error.message());
    remove_unfinished_checkpoints(options_.run_dir);
  });
  options_.run_dir = comm::rank0_string(communicator_, options_.run_dir);
  return comm::rank0_string(communicator_, checkpoint);
}

void Run::resume_from(const std::string& checkpoint) {
  comm::run_on_all_ranks(communicator_, "to load the checkpoint", [&] {
    ExtraState extra;
    resumed_ = load_checkpoint(checkpoint, module_, optimizer_, &extra);
    // The data order: batches_done counts batches of this order, so it must be the same one.
    const bool same_batches = resumed_.batch_size == 0 ||  // first-format checkpoints did not record it
                              (resumed_.batch_size == options_.batch_size && resumed_.shuffle == options_.shuffle &&
                               resumed_.drop_last == options_.drop_last);
    if (resumed_.world_size != world_ || resumed_.sampler_seed != options_.seed || resumed_.epochs != options_.epochs ||
        !same_batches) {
      throw InvalidArgument(fmt::format(
          "{} was written by a run with world size {}, --seed {}, --epochs {}, --batch-size {}{}; resume with the "
          "same values (now {}, {}, {}, {}{}), or start a new run in another --run-dir",
          checkpoint, resumed_.world_size, resumed_.sampler_seed, resumed_.epochs, resumed_.batch_size,
          resumed_.shuffle ? "" : ", --no-shuffle", world_, options_.seed, options_.epochs, options_.batch_size,
          options_.shuffle ? "" : ", --no-shuffle"));
    }
    // batches_done counts batches of the training set the checkpoint was written with: another one would skip or
    // repeat samples. Checkpoints of tandems that did not record it say 0 samples; a fingerprint of 0 cannot tell.
    const uint64_t fingerprint = train_set_->fingerprint();
    if (resumed_.train_samples != 0 &&
        (resumed_.train_samples != train_set_->size() ||
         (resumed_.train_fingerprint != 0 && fingerprint != 0 && resumed_.train_fingerprint != fingerprint))) {
      throw InvalidArgument(fmt::format(
          "{} was written by a run on a training set of {} samples (fingerprint {:016x}), and this run's has {} "
          "(fingerprint {:016x}); resume with the same training data, or start a new run in another --run-dir",
          checkpoint, resumed_.train_samples, resumed_.train_fingerprint, train_set_->size(), fingerprint));
    }
    restore_rng_states(resumed_.rng, rank_, world_, rng_devices());
    if (scaler_.is_enabled() && resumed_.grad_scaler) scaler_.load_state_dict(*resumed_.grad_scaler);
    if (callbacks_.load_extra) callbacks_.load_extra(extra);
  });
  step_ = resumed_.step;
  log::main_info("resuming from {} (epoch {}, batch {}, step {})", checkpoint, resumed_.epoch, resumed_.batches_done,
                 resumed_.step);
  if (options_.comm_hook == "powersgd" && step_ > options_.powersgd.start_powersgd_iter) {
    log::main_info("PowerSGD's error feedback and warm-start state are not in checkpoints: they start anew here, so "
                   "this run does not continue bit-identically");
  }
  if (resumed_.precision != amp::to_string(options_.precision)) {
    log::main_info("the run trained in precision {} so far and continues in {}", resumed_.precision,
                   amp::to_string(options_.precision));
  }
  if (resumed_.epoch >= options_.epochs || steps_exhausted()) {
    log::main_info("{} has already finished training; nothing is left to do (pass another --run-dir for a new run)",
                   options_.run_dir);
  }
}

void Run::set_lr(int epoch) {
  const double factor = schedule_.factor(epoch) * schedule_.warmup_factor(step_);
  auto& groups = optimizer_.param_groups();
  for (size_t g = 0; g < groups.size(); ++g) groups[g].options().set_lr(base_lrs_[g] * factor);
}

TrainResult Run::execute() {
  const std::string checkpoint = prepare_run_dir();
  if (communicator_) {
    data::verify_ranks_hold_same_data(*communicator_, *train_set_, "training data");
    if (eval_set_) data::verify_ranks_hold_same_data(*communicator_, *eval_set_, "evaluation data");
  }
  if (callbacks_.on_run_start) {
    comm::run_on_all_ranks(communicator_, "at the run's start", [&] { callbacks_.on_run_start(options_.run_dir); });
  }
  // Onto the rank's device before DDP forms its buckets next to the gradients. Module::to moves the parameters'
  // data in place, so the optimizer's references stay valid.
  module_.to(options_.device);
  if (options_.strategy == Strategy::kDataParallel) {
    dp_model_ = std::make_unique<dp::DataParallel>(model_, dp::DataParallelOptions{
        options_.dp_devices.empty() ? dp::replica_devices(options_.device, 0) : options_.dp_devices, {}});
  } else {
    if (communicator_ && world_ > 1) ddp::require_backend_reduces(options_.comm_hook, *communicator_);
    ddp::DdpOptions ddp_options;
    ddp_options.check_replicas_every = options_.check_replicas_every;
    ddp_options.bucket_plan = ddp::BucketPlan::kAdaptToHost;
    ddp_options.comm_hook = ddp::make_comm_hook(options_.comm_hook, options_.powersgd);
    ddp_model_ = std::make_unique<ddp::DistributedDataParallel<nn::ModelHolder>>(model_, communicator_ptr_,
                                                                                 ddp_options);
  }
  if (!checkpoint.empty()) resume_from(checkpoint);

  const int64_t batches_per_epoch = make_loaders();
  steps_per_epoch_ = (batches_per_epoch + options_.accumulate_batches - 1) / options_.accumulate_batches;
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
  progress_ = std::make_unique<ProgressReporter>(batches_per_epoch, options_.batch_size * world_,
                                                 progress_options);

  TrainResult result;
  result.run_dir = options_.run_dir;
  stop_ = steps_exhausted();
  for (int epoch = resumed_.epoch; epoch < options_.epochs && !stop_; ++epoch) {
    EpochProgress progress;
    if (epoch == resumed_.epoch && resumed_.batches_done > 0) {
      progress = {resumed_.batches_done, resumed_.epoch_loss_sum, resumed_.epoch_steps, resumed_.epoch_samples,
                  resumed_.epoch_train_seconds};
    }
    progress = train_epoch(epoch, progress);
    result.epochs.push_back(evaluate_epoch(epoch, progress));
    const bool complete = !stop_ || progress.steps >= steps_per_epoch_;
    write_checkpoint(complete ? checkpoint_state(epoch + 1, {}) : checkpoint_state(epoch, progress));
  }
  if (run_timeline_) run_timeline_->finish(step_);
  if (options_.report) write_report();
  result.steps = step_;
  return result;
}

// The training is done and saved by now: a report that cannot be drawn is worth a line, not a failed run.
void Run::write_report() {
  if (!is_main_) return;
  try {
    log::main_info("report: {}", records_->write_report());
  } catch (const std::exception& error) {
    log::main_info("no report written: {}", error.what());
  }
}

// The training loader in the DistributedSampler's shuffled order, the evaluation loader in its plain order with
// every sample kept; returns the training batches per epoch, the same on every rank.
int64_t Run::make_loaders() {
  const data::BatchLoaderOptions loading{options_.prefetch_batches, options_.device};
  data::DistributedSamplerOptions train_sampling{world_, rank_, options_.shuffle, options_.seed, false};
  train_sampling.uneven = options_.uneven_inputs;
  // Uneven inputs train every sample once, so no rank drops its partial last batch; a last batch of one sample
  // joins the one before it, where BatchNorm could not train on it alone.
  const bool drop_last = options_.drop_last && !options_.uneven_inputs;
  const data::SingleSampleTail tail =
      options_.uneven_inputs ? data::SingleSampleTail::kMergeIntoPrevious : data::SingleSampleTail::kKeep;
  train_loader_ = std::make_unique<data::BatchLoader>(
      train_set_, data::BatchSampler(data::DistributedSampler(train_set_->size(), train_sampling), options_.batch_size,
                                     drop_last, tail),
      loading);
  if (eval_set_) {
    data::DistributedSamplerOptions eval_sampling{world_, rank_, false, options_.seed, false};
    eval_loader_ = std::make_unique<data::BatchLoader>(
        eval_set_, data::BatchSampler(data::DistributedSampler(eval_set_->size(), eval_sampling), options_.batch_size,
                                      /*drop_last=*/false),
        loading);
  }
  // With uneven inputs rank 0 has the most samples; its batches are the epoch's length.
  data::DistributedSamplerOptions first_rank = train_sampling;
  first_rank.rank = 0;
  const int64_t batches_per_epoch =
      data::BatchSampler(data::DistributedSampler(train_set_->size(), first_rank), options_.batch_size, drop_last, tail)
          .num_batches();
  if (batches_per_epoch == 0) {
    throw InvalidArgument(fmt::format("the training set has {} samples: fewer than one batch of {} per rank over {} ranks",
                                      train_set_->size(), options_.batch_size, world_));
  }
  return batches_per_epoch;
}

torch::Tensor Run::forward_for_training(const torch::Tensor& x) {
  if (!dp_model_) return ddp_model_->forward(x);
  // DataParallel splits the rows; a batch of none (every image unreadable) goes through the model itself.
  return x.size(0) > 0 ? dp_model_->forward(x) : model_.forward(x);
}

EpochProgress Run::train_epoch(int epoch, EpochProgress progress) {
  module_.train();
  if (callbacks_.on_epoch_start) {
    comm::run_on_all_ranks(communicator_, "in on_epoch_start", [&] { callbacks_.on_epoch_start(epoch); });
  }
  // Inside a resumed epoch its finished batches are skipped in the sampler's order, never loaded.
  train_loader_->start_epoch(epoch, progress.batches_done);
  progress_->start_epoch(epoch, progress.batches_done);
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
    const int64_t wanted = std::min(options_.accumulate_batches, batches_here - progress.batches_done);
    if (static_cast<int64_t>(step_batches.size()) < wanted) continue;
    const StepStatistics stats = train_step(epoch, progress.batches_done, step_batches);
    progress.batches_done += static_cast<int64_t>(step_batches.size());
    step_batches.clear();
    count_step(progress, stats);
    if (steps_exhausted()) {
      stop_ = true;
      break;
    }
    if (options_.checkpoint_every > 0 && step_ % options_.checkpoint_every == 0 && progress.steps < steps_per_epoch_) {
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
  if (stop_ && progress.steps < steps_per_epoch_) rng_at_stop_ = gather_rng_states(communicator_, rng_devices());
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
    if (ddp_model_ && i + 1 < count) local_only.emplace(ddp_model_->reducer());
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
    if (rank_ == injection_.rank && step_ == injection_.step) loss = loss * std::numeric_limits<float>::quiet_NaN();
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
    stepped = scaler_.step(optimizer_);
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
  if (callbacks_.on_step) callbacks_.on_step({epoch, batch_index, step_, mean_loss, lr, stepped, scaler_.get_scale()});
}

EpochMetrics Run::evaluate_epoch(int epoch, const EpochProgress& progress) {
  EpochMetrics m;
  m.epoch = epoch;
  m.loss = progress.steps > 0 ? progress.loss_sum / progress.steps : 0.0;
  m.lr = optimizer_.param_groups()[0].options().get_lr();
  // The slowest rank's time is the epoch's, and every rank reports the same metrics.
  torch::Tensor seconds = torch::tensor({progress.seconds}, torch::kFloat64);
  if (communicator_ && world_ > 1) comm::all_reduce_values(*communicator_, seconds, comm::ReduceOp::Max);
  m.train_seconds = seconds.item<double>();
  m.samples_per_second = m.train_seconds > 0 ? progress.samples / m.train_seconds : 0.0;
  m.step = step_;
  // Each rank's buffers (BatchNorm's running statistics) moved with its own last batch, after that step's
  // broadcast: every rank takes rank 0's, so that what is evaluated is what the checkpoint saves. Uneven inputs
  // ended in Join, which already gave every rank the replica of the last rank to train.
  if (ddp_model_ && world_ > 1 && !options_.uneven_inputs && !module_.buffers().empty()) {
    ddp_model_->reducer().copy_replica_from(0);
  }
  if (eval_loader_) {
    // The bare model: its weights are identical on every rank, and DDP has no gradients to reduce here.
    module_.eval();
    const EvalCounts counts = evaluate([&](const torch::Tensor& x) { return in_precision([&] { return model_.forward(x); }); },
                                       *eval_loader_, epoch, communicator_);
    m.accuracy = counts.accuracy();
    m.correct = counts.correct;
    m.total = counts.total;
  }
  comm::run_on_all_ranks(communicator_, "to write metrics.jsonl", [&] {
    if (!is_main_) return;
    const std::string accuracy = eval_loader_ ? fmt::format(" accuracy {:.4f}", m.accuracy) : "";
    std::printf("[epoch %d] loss %.4f%s lr %s\n", epoch, m.loss, accuracy.c_str(), fmt::format("{:.6g}", m.lr).c_str());
    std::fflush(stdout);
    records_->record_epoch(m);
  });
  if (callbacks_.on_epoch_end) {
    comm::run_on_all_ranks(communicator_, "in on_epoch_end", [&] { callbacks_.on_epoch_end(m); });
  }
  return m;
}

// The run's state after `progress.batches_done` batches of `epoch`, with that epoch's loss and time so far.
CheckpointState Run::checkpoint_state(int epoch, const EpochProgress& progress) const {
  CheckpointState state;
  state.epoch = epoch;
  state.batches_done = progress.batches_done;
  state.step = step_;
  state.lr = optimizer_.param_groups()[0].options().get_lr();
  state.base_lr = base_lrs_[0];
  state.lrf = options_.lrf;
  state.warmup_steps = options_.warmup_steps;
  state.epochs = options_.epochs;
  state.sampler_seed = options_.seed;
  state.world_size = world_;
  state.batch_size = options_.batch_size;
  state.shuffle = options_.shuffle;
  state.drop_last = options_.drop_last;
  state.train_samples = train_set_->size();
  state.train_fingerprint = train_set_->fingerprint();
  state.precision = amp::to_string(options_.precision);
  if (scaler_.is_enabled()) state.grad_scaler = scaler_.state_dict();
  state.epoch_loss_sum = progress.loss_sum;
  state.epoch_steps = progress.steps;
  state.epoch_train_seconds = progress.seconds;
  state.epoch_samples = progress.samples;
  return state;
}

// Rank 0 writes the checkpoint; every rank learns whether it worked.
void Run::write_checkpoint(const CheckpointState& state) {
  if (!options_.checkpoint) return;
  CheckpointState complete = state;
  complete.rng = rng_at_stop_.cpu.defined() ? rng_at_stop_ : gather_rng_states(communicator_, rng_devices());
  // Sharded optimizer state is gathered to rank 0 by every rank, before rank 0 alone saves it.
  if (auto* sharded = dynamic_cast<optim::ZeroRedundancyOptimizer*>(&optimizer_)) sharded->consolidate_state_dict(0);
  comm::run_on_all_ranks(communicator_, "to write the checkpoint", [&] {
    if (!is_main_) return;
    const ExtraState extra = callbacks_.save_extra ? callbacks_.save_extra() : ExtraState{};
    save_checkpoint(checkpoint_path(options_.run_dir, state.epoch, state.batches_done), module_, optimizer_, complete,
                    extra);
    prune_checkpoints(options_.run_dir, options_.keep_checkpoints);
  });
}

}  // namespace

torch::Tensor cross_entropy_loss(const torch::Tensor& logits, const torch::Tensor& target) {
  return torch::nn::functional::cross_entropy(logits, target);
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
  Run run(options_, callbacks_, resolve_group(), std::move(model), optimizer, std::move(train_set), std::move(eval_set));
  return run.execute();
}

}  // namespace tandem::train
