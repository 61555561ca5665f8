// The one place the loop's strategy is chosen (strategies.h), and what the strategies share.
#include "strategies.h"

#include <fmt/format.h>

#include "tandem/util/error.h"
#include "tandem/util/needs.h"

namespace tandem::train {
namespace {

// The whole state on every rank: rank 0 saves it, every rank loads it.
class ReplicaState : public CheckpointWriter, public CheckpointReader {
 public:
  ReplicaState(torch::nn::Module& module, torch::optim::Optimizer& optimizer, optim::ZeroRedundancyOptimizer* sharded)
      : module_(module), optimizer_(optimizer), sharded_(sharded) {}

  void write(const std::string& path, const checkpoint::CheckpointState& state, const checkpoint::ExtraState& extra) override {
    if (sharded_) {
      checkpoint::save_checkpoint(path, module_, *sharded_, state, extra);
    } else {
      checkpoint::save_checkpoint(path, module_, optimizer_, state, extra);
    }
  }

  checkpoint::CheckpointState read(const std::string& path, checkpoint::ExtraState* extra) override {
    return sharded_ ? checkpoint::load_checkpoint(path, module_, *sharded_, extra) : checkpoint::load_checkpoint(path, module_, optimizer_, extra);
  }

 private:
  torch::nn::Module& module_;
  torch::optim::Optimizer& optimizer_;
  optim::ZeroRedundancyOptimizer* sharded_;
};

}  // namespace

std::unique_ptr<ParallelStrategy> make_parallel_strategy(const LoopOptions& options,
                                                         optim::ZeroRedundancyOptimizer* sharded) {
  switch (options.strategy) {
    case Strategy::kDataParallel: return make_data_parallel_strategy(sharded);
    case Strategy::kFsdp: return make_fsdp_strategy();
    case Strategy::kDdp: break;
  }
  return make_ddp_strategy(sharded);
}

void refuse_uneven_inputs(const std::string& conflict) {
  throw InvalidArgument(fmt::format("`uneven_inputs` cannot be combined with {}; drop one of them", conflict));
}

void require_full_checkpoint_format(const LoopOptions& options) {
  if (options.checkpoint_format == checkpoint::CheckpointFormat::kSharded) {
    throw InvalidArgument(needs("`checkpoint_format` sharded", "`strategy` fsdp",
                                "only fsdp's ranks hold shards to write; drop `checkpoint_format`, or use `strategy` fsdp"));
  }
}

std::unique_ptr<CheckpointWriter> replica_checkpoint_writer(torch::nn::Module& module,
                                                            torch::optim::Optimizer& optimizer,
                                                            optim::ZeroRedundancyOptimizer* sharded) {
  if (sharded) sharded->consolidate_state_dict(0);
  return std::make_unique<ReplicaState>(module, optimizer, sharded);
}

std::unique_ptr<CheckpointReader> replica_checkpoint_reader(torch::nn::Module& module,
                                                            torch::optim::Optimizer& optimizer,
                                                            optim::ZeroRedundancyOptimizer* sharded) {
  return std::make_unique<ReplicaState>(module, optimizer, sharded);
}

}  // namespace tandem::train
