// Strategy::kFsdp: one process per device, each rank holding one shard of every parameter, gradient and optimizer
// state (fsdp/fully_sharded_data_parallel.h, with LoopOptions::fsdp). The optimizer steps the shards from wrap()
// to unwrap(); checkpoints hold the full state, gathered on every rank (fsdp/full_state_view.h), or with
// CheckpointFormat::kSharded each rank's pieces (checkpoint/fsdp_sharded_checkpoint.h).
#include <fmt/format.h>

#include <memory>
#include <optional>
#include <vector>

#include "strategies.h"
#include "tandem/checkpoint/checkpoint.h"
#include "tandem/checkpoint/checkpoint_format.h"
#include "tandem/checkpoint/fsdp_sharded_checkpoint.h"
#include "tandem/comm/rank_agreement.h"
#include "tandem/fsdp/fully_sharded_data_parallel.h"
#include "tandem/fsdp/full_state_view.h"
#include "tandem/fsdp/unused_parameters.h"
#include "tandem/util/error.h"

namespace tandem::train {
namespace {

// The full state, gathered for as long as the checkpoint is written or read.
class FullState : public CheckpointWriter, public CheckpointReader {
 public:
  FullState(fsdp::ShardedModel& model, torch::nn::Module& module, torch::optim::Optimizer& optimizer)
      : view_(model, module, optimizer), module_(module), optimizer_(optimizer) {}

  void write(const std::string& path, const checkpoint::CheckpointState& state, const checkpoint::ExtraState& extra) override {
    checkpoint::save_checkpoint(path, module_, optimizer_, state, extra);
  }

  checkpoint::CheckpointState read(const std::string& path, checkpoint::ExtraState* extra) override {
    checkpoint::CheckpointState state = checkpoint::load_checkpoint(path, module_, optimizer_, extra);
    view_.commit();
    return state;
  }

 private:
  fsdp::FullStateView view_;
  torch::nn::Module& module_;
  torch::optim::Optimizer& optimizer_;
};

// Each rank's pieces: rank 0 completes the checkpoint every rank wrote its file of, and every rank cuts its
// shards from a sharded checkpoint's pieces.
class ShardPieces : public CheckpointWriter, public CheckpointReader {
 public:
  ShardPieces(fsdp::ShardedModel& model, torch::nn::Module& module, torch::optim::Optimizer& optimizer)
      : model_(model), module_(module), optimizer_(optimizer) {}

  void write(const std::string& path, const checkpoint::CheckpointState& state, const checkpoint::ExtraState& extra) override {
    checkpoint::write_fsdp_checkpoint_file(path, model_, module_, optimizer_, state, extra);
  }

  checkpoint::CheckpointState read(const std::string& path, checkpoint::ExtraState* extra) override {
    return checkpoint::load_fsdp_sharded_checkpoint(path, model_, module_, optimizer_, extra);
  }

 private:
  fsdp::ShardedModel& model_;
  torch::nn::Module& module_;
  torch::optim::Optimizer& optimizer_;
};

class FsdpStrategy : public ParallelStrategy {
 public:
  void validate(const LoopOptions& options, int /*world_size*/) const override {
    if (options.comm_hook != "average") {
      throw InvalidArgument(fmt::format("`comm_hook` {} shapes DDP's all-reduce, and `strategy` fsdp reduce-scatters "
                                        "its gradients itself: drop `comm_hook`, or use `strategy` ddp",
                                        options.comm_hook));
    }
    const fsdp::MixedPrecision& precision = options.fsdp.mixed_precision;
    if (precision.param_dtype != torch::kFloat32 || precision.reduce_dtype) {
      throw InvalidArgument("fsdp.mixed_precision's dtypes follow `precision`: leave them float32 and set "
                            "`precision` bf16-mixed or 16-mixed, which gathers bfloat16 or float16 parameters and "
                            "reduces in float32");
    }
    if (options.uneven_inputs) {
      refuse_uneven_inputs("`strategy` fsdp (a rank out of data cannot answer the others' all-gathers)");
    }
  }

  void wrap(const ModelToWrap& model) override {
    torch::nn::Module& module = *model.model;
    fsdp::require_fsdp_optimizer(model.optimizer, module);
    fsdp::FsdpOptions options = model.options.fsdp;
    // bf16-mixed and 16-mixed compute on bfloat16 and float16 parameters gathered from float32 shards; gradients
    // are reduced in float32, so the ranks' sum rounds no further than DDP's (docs/fsdp.md, "Mixed precision").
    // Autocast (the loop's, around each forward) still runs, for the losses and norms it keeps in float32.
    if (const auto dtype = amp::autocast_dtype(model.options.precision)) {
      options.mixed_precision.param_dtype = *dtype;
      options.mixed_precision.reduce_dtype = torch::kFloat32;
    }
    model_ = std::make_unique<fsdp::FullyShardedDataParallel<nn::ModelHolder>>(model.model, model.communicator, options);
    fsdp::shard_optimizer(model_->sharded(), module, model.optimizer);
    communicator_ = model.communicator;
    optimizer_ = &model.optimizer;
    device_ = model.options.device;
    format_ = model.options.checkpoint_format;
  }

  torch::Tensor forward(const torch::Tensor& input) override { return model_->forward(input); }

  std::unique_ptr<LocalAccumulation> accumulate_locally() override {
    return std::make_unique<GuardedAccumulation<fsdp::NoSyncGuard>>(model_->no_sync());
  }

  bool step(const std::function<bool()>& optimizer_step) override {
    bool stepped = false;
    fsdp::step_leaving_unused(model_->sharded(), *optimizer_, [&] { stepped = optimizer_step(); });
    return stepped;
  }

  // A callback that read the model's own tensors read placeholders (zeros): fsdp's line about it, at once.
  void after_user_code() override { model_->sharded().rethrow_failure(); }

  // Gathers each unit's parameters (every rank runs as many forwards, evaluate() sees to it).
  torch::Tensor evaluation_forward(const torch::Tensor& input) override { return model_->forward(input); }

  std::vector<torch::Device> devices() const override { return {device_}; }

  // Every rank's pieces are in place before rank 0 writes the file that completes the checkpoint.
  std::unique_ptr<CheckpointWriter> prepare_checkpoint(const std::string& path) override {
    if (format_ != checkpoint::CheckpointFormat::kSharded) return std::make_unique<FullState>(model_->sharded(), module(), *optimizer_);
    comm::run_on_all_ranks(communicator_.get(), "to write its shards of the checkpoint",
                           [&] { checkpoint::write_fsdp_shard_file(path, model_->sharded(), module(), *optimizer_); });
    return std::make_unique<ShardPieces>(model_->sharded(), module(), *optimizer_);
  }

  // The shards are cut from a sharded checkpoint's pieces, or from the full state loaded as DDP loads it (on any
  // world size).
  std::unique_ptr<CheckpointReader> restore_from(const std::string& path) override {
    if (checkpoint::stored_format(path) == checkpoint::StoredFormat::kSharded) return std::make_unique<ShardPieces>(model_->sharded(), module(), *optimizer_);
    return std::make_unique<FullState>(model_->sharded(), module(), *optimizer_);
  }

  // The caller gets its model and optimizer back as DDP leaves them: full parameters (the same on every rank), and
  // the optimizer over them with the whole state.
  void unwrap() override {
    fsdp::FullStateView(model_->sharded(), module(), *optimizer_).keep();
    model_.reset();
  }

 private:
  torch::nn::Module& module() { return *model_->module(); }

  std::unique_ptr<fsdp::FullyShardedDataParallel<nn::ModelHolder>> model_;
  comm::CommunicatorPtr communicator_;
  torch::optim::Optimizer* optimizer_ = nullptr;
  torch::Device device_ = torch::kCPU;
  CheckpointFormat format_ = checkpoint::CheckpointFormat::kFull;
};

}  // namespace

std::unique_ptr<ParallelStrategy> make_fsdp_strategy() { return std::make_unique<FsdpStrategy>(); }

}  // namespace tandem::train
