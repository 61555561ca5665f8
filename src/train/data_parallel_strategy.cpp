// Strategy::kDataParallel: one process, the model replicated over LoopOptions::dp_devices in threads
// (dp/data_parallel.h); batch_size is then the whole step's batch, split among the replicas, and a checkpoint
// holds every replica's generators.
#include <fmt/format.h>

#include <memory>
#include <optional>
#include <vector>

#include "strategies.h"
#include "tandem/dp/data_parallel.h"
#include "tandem/util/error.h"

namespace tandem::train {
namespace {

class DataParallelStrategy : public ParallelStrategy {
 public:
  explicit DataParallelStrategy(optim::ZeroRedundancyOptimizer* sharded) : sharded_(sharded) {}

  void validate(const LoopOptions& options, int world_size) const override {
    if (options.comm_hook != "average") {
      throw InvalidArgument(fmt::format("`comm_hook` {} shapes DDP's all-reduce between processes, and DataParallel "
                                        "reduces inside one process: drop `comm_hook`, or use `strategy` ddp",
                                        options.comm_hook));
    }
    require_full_checkpoint_format(options);
    if (options.uneven_inputs) refuse_uneven_inputs("`strategy` dp (one process has no uneven ranks)");
    if (world_size > 1) {
      throw InvalidArgument(fmt::format("`strategy` dp (DataParallel) trains in one process, but this is one of {}: "
                                        "use ddp under tandem run, or start a single process",
                                        world_size));
    }
  }

  void wrap(const ModelToWrap& model) override {
    const LoopOptions& options = model.options;
    model_ = std::make_unique<dp::DataParallel>(model.model, dp::DataParallelOptions{
        options.dp_devices.empty() ? dp::replica_devices(options.device, 0) : options.dp_devices, {}});
    holder_.emplace(model.model);
    optimizer_ = &model.optimizer;
  }

  // DataParallel splits the rows; a batch of none (every image unreadable) goes through the model itself.
  torch::Tensor forward(const torch::Tensor& input) override {
    return input.size(0) > 0 ? model_->forward(input) : holder_->forward(input);
  }

  torch::Tensor evaluation_forward(const torch::Tensor& input) override { return holder_->forward(input); }

  std::vector<torch::Device> devices() const override { return model_->devices(); }

  std::unique_ptr<CheckpointWriter> prepare_checkpoint(const std::string& /*path*/) override {
    return replica_checkpoint_writer(model_->module(), *optimizer_, sharded_);
  }

  std::unique_ptr<CheckpointReader> restore_from(const std::string& /*path*/) override {
    return replica_checkpoint_reader(model_->module(), *optimizer_, sharded_);
  }

 private:
  optim::ZeroRedundancyOptimizer* sharded_;
  std::unique_ptr<dp::DataParallel> model_;
  std::optional<nn::ModelHolder> holder_;  // the replicas' original, replica 0
  torch::optim::Optimizer* optimizer_ = nullptr;
};

}  // namespace

std::unique_ptr<ParallelStrategy> make_data_parallel_strategy(optim::ZeroRedundancyOptimizer* sharded) {
  return std::make_unique<DataParallelStrategy>(sharded);
}

}  // namespace tandem::train
