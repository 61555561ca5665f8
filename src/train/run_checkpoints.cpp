// The Run's checkpoints (train/run.h): continuing from one, and writing one. Rank 0 writes the checkpoint file,
// after every rank has sent it its generators and the strategy has done its part: a sharded optimizer's shares
// sent to rank 0, FSDP's full state gathered, or each FSDP rank's shards written to a file of its own
// (train/parallel_strategy.h).
#include <fmt/format.h>

#include <algorithm>

#include "run.h"
#include "tandem/checkpoint/checkpoint_folder.h"
#include "tandem/comm/rank_agreement.h"
#include "tandem/util/log.h"

namespace tandem::train {
namespace {

// The checkpoint's position counts samples of the epoch's order, which the seed, the shuffle and the training set
// make: under another order or other data it would skip or repeat samples. drop_last and epochs shape which
// samples an epoch trains and how many epochs there are. World size and batch size may change (the position
// carries over), except for checkpoints of the first format, which recorded no batch size to count in. `now` is
// this run's state at its start.
void require_same_data(const checkpoint::CheckpointState& saved, const checkpoint::CheckpointState& now,
                       const std::string& path) {
  if (saved.batch_size == 0 && saved.batches_done > 0 && saved.world_size != now.world_size) {
    throw InvalidArgument(fmt::format(
        "{} was written inside an epoch by a tandem that did not record its batch size, on world size {}: continue "
        "it on {} ranks with its `batch_size`, or start a new run in another `run_dir`",
        path, saved.world_size, saved.world_size));
  }
  const bool same_order = saved.batch_size == 0 ||  // first-format checkpoints did not record these
                          (saved.shuffle == now.shuffle && saved.drop_last == now.drop_last);
  if (saved.sampler_seed != now.sampler_seed || saved.epochs != now.epochs || !same_order) {
    throw InvalidArgument(fmt::format(
        "{} was written by a run with `seed` {}, `epochs` {}{}{}; resume with the same values (now {}, {}{}{}), or "
        "start a new run in another `run_dir`",
        path, saved.sampler_seed, saved.epochs, saved.shuffle ? "" : ", unshuffled",
        saved.drop_last ? "" : ", keeping partial batches", now.sampler_seed, now.epochs,
        now.shuffle ? "" : ", unshuffled", now.drop_last ? "" : ", keeping partial batches"));
  }
  // Checkpoints of tandems that did not record the training set say 0 samples; a fingerprint of 0 cannot tell.
  if (saved.train_samples != 0 &&
      (saved.train_samples != now.train_samples ||
       (saved.train_fingerprint != 0 && now.train_fingerprint != 0 && saved.train_fingerprint != now.train_fingerprint))) {
    throw InvalidArgument(fmt::format(
        "{} was written by a run on a training set of {} samples (fingerprint {:016x}), and this run's has {} "
        "(fingerprint {:016x}); resume with the same training data, or start a new run in another `run_dir`",
        path, saved.train_samples, saved.train_fingerprint, now.train_samples, now.train_fingerprint));
  }
}

// Where the checkpoint's epoch continues in its order: recorded, or (older checkpoints) what its batches on its
// layout covered. A first-format checkpoint's batch size is this run's (require_same_data saw to it).
int64_t resumed_position(const checkpoint::CheckpointState& saved, const checkpoint::CheckpointState& now) {
  if (saved.sample_position >= 0) return saved.sample_position;
  const int64_t batch_size = saved.batch_size > 0 ? saved.batch_size : now.batch_size;
  const int64_t trained = saved.batches_done * batch_size * saved.world_size;
  return saved.train_samples > 0 ? std::min(trained, saved.train_samples) : std::min(trained, now.train_samples);
}

}  // namespace

void Run::resume_from(const std::string& checkpoint) {
  const std::unique_ptr<CheckpointReader> reader = strategy_->restore_from(checkpoint);
  comm::run_on_all_ranks(communicator_, "to load the checkpoint", [&] {
    checkpoint::ExtraState extra;
    resumed_ = reader->read(checkpoint, &extra);
    const checkpoint::CheckpointState now = checkpoint_state(0, {});
    require_same_data(resumed_, now, checkpoint);
    resumed_position_ = resumed_position(resumed_, now);
    checkpoint::continue_rng_states(resumed_.rng, rank_, options_.seed, strategy_->devices());
    if (scaler_.is_enabled() && resumed_.grad_scaler) scaler_.load_state_dict(*resumed_.grad_scaler);
    if (callbacks_.load_extra) callbacks_.load_extra(extra);
  });
  step_ = resumed_.step;
  log::main_info("resuming from {} (epoch {}, batch {}, step {})", checkpoint, resumed_.epoch, resumed_.batches_done,
                 resumed_.step);
  continue_layout();
  if (options_.comm_hook == "powersgd" && step_ > options_.powersgd.start_powersgd_iter) {
    log::main_info("PowerSGD's error feedback and warm-start state are not in checkpoints: they start anew here, so "
                   "this run does not continue bit-identically");
  }
  if (resumed_.precision != amp::to_string(options_.precision)) {
    log::main_info("the run trained in precision {} so far and continues in {}", resumed_.precision,
                   amp::to_string(options_.precision));
  }
  if (resumed_.epoch >= options_.epochs || steps_exhausted()) {
    log::main_info("{} has already finished training; nothing is left to do (a new run needs another run dir)",
                   options_.run_dir);
  }
}

// A checkpoint of another world size, batch size or accumulation: the learning rate follows the global batch of a
// step, measured against the step batch the run started with (a resume that keeps the global batch keeps the
// rate), and the run says where its epoch continues. Checkpoints that did not record the first batch size started
// with their own; those that did not record the accumulation accumulated as this run does.
void Run::continue_layout() {
  const int64_t saved_batch = resumed_.batch_size > 0 ? resumed_.batch_size : options_.batch_size;
  const int64_t saved_accumulate =
      resumed_.accumulate_batches > 0 ? resumed_.accumulate_batches : options_.accumulate_batches;
  initial_batch_size_ = resumed_.initial_batch_size > 0 ? resumed_.initial_batch_size : saved_batch;
  initial_accumulate_batches_ =
      resumed_.initial_accumulate_batches > 0 ? resumed_.initial_accumulate_batches : options_.accumulate_batches;
  scale_base_lrs();
  const int64_t saved_global = resumed_.world_size * saved_batch * saved_accumulate,
                global = world_ * options_.batch_size * options_.accumulate_batches;
  const int64_t first_step_batch = initial_batch_size_ * initial_accumulate_batches_;
  if (resumed_.world_size != world_ || saved_batch != options_.batch_size) {
    log::main_info("the run continues on {} rank{} x batch {} where it stopped on {} x {}: epoch {} goes on from "
                   "sample {} of {} in its order",
                   world_, world_ == 1 ? "" : "s", options_.batch_size, resumed_.world_size, saved_batch,
                   resumed_.epoch, resumed_position_, train_set_->size());
  }
  if (options_.scale_lr_by_world_size && saved_global != global) {
    log::main_info("the global batch goes from {} to {}: the learning rate's scale goes from {:g} to {:g} (global "
                   "batch / the batch per rank and step the run started with, {} x {} accumulated)",
                   saved_global, global, static_cast<double>(saved_global) / first_step_batch,
                   static_cast<double>(global) / first_step_batch, initial_batch_size_, initial_accumulate_batches_);
  }
}

// The run's state after `progress.batches_done` batches of `epoch`, with that epoch's loss and time so far.
checkpoint::CheckpointState Run::checkpoint_state(int epoch, const EpochProgress& progress) const {
  checkpoint::CheckpointState state;
  state.epoch = epoch;
  state.batches_done = progress.batches_done;
  state.sample_position = progress.batches_done > 0 ? position_done(progress) : 0;
  state.step = step_;
  state.lr = optimizer_.param_groups()[0].options().get_lr();
  state.base_lr = base_lrs_[0];
  state.initial_batch_size = initial_batch_size_;
  state.initial_accumulate_batches = initial_accumulate_batches_;
  state.accumulate_batches = options_.accumulate_batches;
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
  state.model_name = options_.model_name;
  if (scaler_.is_enabled()) state.grad_scaler = scaler_.state_dict();
  state.epoch_loss_sum = progress.loss_sum;
  state.epoch_steps = progress.steps;
  state.epoch_train_seconds = progress.seconds;
  state.epoch_samples = progress.samples;
  return state;
}

// Rank 0 writes the checkpoint; every rank learns whether it worked.
void Run::write_checkpoint(const checkpoint::CheckpointState& state) {
  if (!options_.checkpoint) return;
  checkpoint::CheckpointState complete = state;
  complete.rng =
      rng_at_stop_.cpu.defined() ? rng_at_stop_ : checkpoint::gather_rng_states(communicator_, strategy_->devices());
  const std::string path = checkpoint::checkpoint_path(options_.run_dir, state.epoch, state.batches_done);
  const std::unique_ptr<CheckpointWriter> writer = strategy_->prepare_checkpoint(path);
  comm::run_on_all_ranks(communicator_, "to write the checkpoint", [&] {
    if (!is_main_) return;
    const checkpoint::ExtraState extra = callbacks_.save_extra ? callbacks_.save_extra() : checkpoint::ExtraState{};
    writer->write(path, complete, extra);
    checkpoint::prune_checkpoints(options_.run_dir, options_.keep_checkpoints);
  });
}

}  // namespace tandem::train
