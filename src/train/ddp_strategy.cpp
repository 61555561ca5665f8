// Strategy::kDdp: one process per device or core group, each rank a whole replica in DistributedDataParallel
// (ddp/distributed_data_parallel.h) with LoopOptions::ddp and the named comm hook; the optimizer plain, or a
// ZeroRedundancyOptimizer sharding its state among the ranks. Uneven inputs end each epoch in ddp::Join.
#include <memory>
#include <vector>

#include "strategies.h"
#include "tandem/ddp/distributed_data_parallel.h"
#include "tandem/ddp/join.h"
#include "tandem/ddp/named_comm_hook.h"
#include "tandem/ddp/no_sync_guard.h"
#include "tandem/util/error.h"

namespace tandem::train {
namespace {

class DdpStrategy : public ParallelStrategy {
 public:
  explicit DdpStrategy(optim::ZeroRedundancyOptimizer* sharded) : sharded_(sharded) {}

  void validate(const LoopOptions& options, int /*world_size*/) const override {
    if (options.ddp.comm_hook) {
      throw InvalidArgument("ddp.comm_hook is the loop's to make, one per fit(), from `comm_hook`: leave it null "
                            "and name the hook in `comm_hook`");
    }
    require_full_checkpoint_format(options);
    if (sharded_ && options.in_job_recovery) {
      throw InvalidArgument("`in_job_recovery` needs a plain optimizer: a ZeroRedundancyOptimizer's shards of a lost "
                            "rank are on no other rank");
    }
    if (!options.uneven_inputs) return;
    // Uneven inputs leave the ranks at different batches; what needs them in step is refused.
    if (options.max_steps > 0) refuse_uneven_inputs("`max_steps` (ranks stop at different batches)");
    if (options.checkpoint_every > 0) {
      refuse_uneven_inputs("`checkpoint_every` (ranks stand at different batches inside an epoch)");
    }
    if (options.comm_hook == "powersgd") {
      refuse_uneven_inputs("`comm_hook` powersgd (a rank out of data still sends its error feedback, so the mean "
                           "over the ranks that trained is not exact)");
    }
  }

  void wrap(const ModelToWrap& model) override {
    const comm::CommunicatorPtr& communicator = model.communicator;
    if (communicator && communicator->world_size() > 1) {
      ddp::require_backend_reduces(model.options.comm_hook, *communicator);
    }
    ddp::DdpOptions options = model.options.ddp;
    options.comm_hook = ddp::make_comm_hook(model.options.comm_hook, model.options.powersgd);
    model_ = std::make_unique<ddp::DistributedDataParallel<nn::ModelHolder>>(model.model, communicator, options);
    optimizer_ = &model.optimizer;
    device_ = model.options.device;
    uneven_inputs_ = model.options.uneven_inputs;
    world_ = communicator ? communicator->world_size() : 1;
  }

  torch::Tensor forward(const torch::Tensor& input) override { return model_->forward(input); }

  std::unique_ptr<LocalAccumulation> accumulate_locally() override {
    return std::make_unique<GuardedAccumulation<ddp::NoSyncGuard>>(ddp::NoSyncGuard(model_->reducer()));
  }

  std::unique_ptr<ddp::Join> join_uneven_inputs() override {
    return uneven_inputs_ ? std::make_unique<ddp::Join>(*model_) : nullptr;
  }

  ddp::Reducer* reducer() override { return &model_->reducer(); }

  // Each rank's buffers (BatchNorm's running statistics) moved with its own last batch, after that step's
  // broadcast: every rank takes rank 0's, so that what is evaluated is what the checkpoint saves. Uneven inputs
  // ended in Join, which already gave every rank the replica of the last rank to train.
  void before_evaluation() override {
    if (world_ > 1 && !uneven_inputs_ && !(*model_->module()).buffers().empty()) model_->reducer().copy_replica_from(0);
  }

  // The bare model: its weights are identical on every rank, and DDP has no gradients to reduce here.
  torch::Tensor evaluation_forward(const torch::Tensor& input) override { return model_->module().forward(input); }

  std::vector<torch::Device> devices() const override { return {device_}; }

  std::unique_ptr<CheckpointWriter> prepare_checkpoint(const std::string& /*path*/) override {
    return replica_checkpoint_writer(*model_->module(), *optimizer_, sharded_);
  }

  std::unique_ptr<CheckpointReader> restore_from(const std::string& /*path*/) override {
    return replica_checkpoint_reader(*model_->module(), *optimizer_, sharded_);
  }

 private:
  optim::ZeroRedundancyOptimizer* sharded_;
  std::unique_ptr<ddp::DistributedDataParallel<nn::ModelHolder>> model_;
  torch::optim::Optimizer* optimizer_ = nullptr;
  torch::Device device_ = torch::kCPU;
  bool uneven_inputs_ = false;
  int world_ = 1;
};

}  // namespace

std::unique_ptr<ParallelStrategy> make_ddp_strategy(optim::ZeroRedundancyOptimizer* sharded) {
  return std::make_unique<DdpStrategy>(sharded);
}

}  // namespace tandem::train
