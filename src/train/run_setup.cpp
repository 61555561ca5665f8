// The Run's set-up (train/run.h): the checks its constructor makes before anything is built, the model wrapped by
// its strategy, and the records opened. What follows the set-up is in loop.cpp (docs/loop.md).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "run.h"
#include "training_loaders.h"
#include "tandem/comm/rank_agreement.h"
#include "tandem/ddp/join.h"
#include "tandem/util/log.h"

namespace tandem::train {
namespace {

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
const LoopOptions& validated(const LoopOptions& options, int world_size, const ParallelStrategy& strategy) {
  validate(options, world_size, strategy);
  return options;
}

}  // namespace

Run::Run(const LoopOptions& options, const LoopCallbacks& callbacks, comm::CommunicatorPtr communicator,
         std::shared_ptr<comm::Membership> membership, std::unique_ptr<ParallelStrategy> strategy,
         nn::ModelHolder model, torch::optim::Optimizer& optimizer, std::shared_ptr<const data::Dataset> train_set,
         std::shared_ptr<const data::Dataset> eval_set)
    : options_(validated(options, world_size_of(communicator), *strategy)),
      callbacks_(callbacks),
      communicator_ptr_(std::move(communicator)),
      communicator_(communicator_ptr_.get()),
      membership_(std::move(membership)),
      holds_state_(!membership_ || membership_->joined()),
      rank_(communicator_ ? communicator_->rank() : 0),
      world_(world_size_of(communicator_ptr_)),
      // A replacement is never rank 0 while it waits: the launcher restarts the job where slot 0 is lost.
      is_main_(rank_ == 0 && holds_state_),
      model_(std::move(model)),
      module_(*model_),
      optimizer_(optimizer),
      train_set_(std::move(train_set)),
      eval_set_(std::move(eval_set)),
      initial_batch_size_(options_.batch_size),
      initial_accumulate_batches_(options_.accumulate_batches),
      schedule_(1.0, options.lrf, options.epochs, options.warmup_steps),
      autocast_dtype_(amp::autocast_dtype(options.precision)),
      scaler_(scaler_options(options), communicator_ptr_),
      strategy_(std::move(strategy)) {
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

// Onto the rank's device before the strategy wraps it (DDP forms its buckets next to the gradients; Module::to
// moves the parameters' data in place, so the optimizer's references stay valid).
void Run::wrap_model() {
  module_.to(options_.device);
  strategy_->wrap({options_, model_, optimizer_, communicator_ptr_});
}

int64_t Run::make_loaders() {
  TrainingLoaders loaders = make_training_loaders(options_, rank_, world_, train_set_, eval_set_);
  train_loader_ = std::move(loaders.train);
  eval_loader_ = std::move(loaders.eval);
  first_rank_batches_ = std::move(loaders.first_rank);
  return loaders.batches_per_epoch;
}

// Rank 0's records, the timeline and the progress bar.
void Run::open_records(int64_t batches_per_epoch) {
  // A replacement taken in is not rank 0, and the members opened theirs long ago.
  if (!joined_in_epoch_) {
    comm::run_on_all_ranks(communicator_, "to open the run's records", [&] {
      if (is_main_) {
        records_ = std::make_unique<RunRecorder>(options_.run_dir, resumed_.epoch, resumed_.step,
                                                RunRecorderOptions{options_.tensorboard, eval_set_ != nullptr});
      }
    });
  }
  if (!options_.timeline_path.empty()) {
    run_timeline_ = std::make_unique<RunTimeline>(options_.timeline_path, options_.timeline_steps, options_.run_dir,
                                                  communicator_, strategy_->reducer());
    timeline_ = run_timeline_->timeline();
  }
  ProgressOptions progress_options;
  progress_options.enabled = is_main_ && options_.progress;
  progress_ = std::make_unique<ProgressReporter>(batches_per_epoch, options_.batch_size * world_, progress_options);
}

}  // namespace tandem::train
