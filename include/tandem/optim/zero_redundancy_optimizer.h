#pragma once
// ZeroRedundancyOptimizer: optimizer-state sharding (ZeRO stage 1), as torch.distributed.optim's class of the same
// name. Each parameter is owned by one rank (optim/parameter_partition.h), and a rank keeps optimizer state only
// for the parameters it owns: about 1/world of a plain optimizer's momentum buffers or Adam moments.
//
//   tandem::ddp::DistributedDataParallel<Net> model(Net(), communicator);
//   tandem::optim::ZeroRedundancyOptimizer optimizer(model.parameters(),
//       tandem::optim::make_optimizer<torch::optim::Adam>(torch::optim::AdamOptions(1e-3)), communicator);
//
// One iteration, on every rank:
//   loss.backward();     // DDP leaves every rank with the averaged gradients of all parameters
//   optimizer.step();    // the local optimizer updates the owned parameters only; then each rank broadcasts
//                        // its updated parameters, flattened into one buffer per dtype, so all replicas agree
// zero_grad() and the learning rate work on param_groups(), which hold every parameter as a plain optimizer's
// would: step() hands their options (lr, momentum, ...) to the local optimizer each time.
//
// Checkpoints, in the format of a plain optimizer of the local kind over all parameters, so that a run can be
// resumed with or without sharding:
//   optimizer.consolidate_state_dict(0);            // collective: rank 0 gathers every rank's state
//   if (rank == 0) optimizer.save(archive);         // (train::Loop does both before each checkpoint)
//   optimizer.load(archive);                        // every rank, the same archive: each keeps its own share
//
// step() and consolidate_state_dict() are collective: every rank calls them in the same order. The param groups
// are fixed at construction (add_param_group afterwards is refused at the next step).
#include <torch/optim/optimizer.h>

#include <functional>
#include <memory>
#include <vector>

#include "tandem/comm/communicator.h"
#include "tandem/optim/parameter_partition.h"

namespace tandem::optim {

// Makes an optimizer over the given param groups; a group without options takes the optimizer's defaults. It
// must keep the groups, in order: ZeroRedundancyOptimizer uses it for the local shard, for the consolidated
// state and for each rank's share of it.
using OptimizerFactory =
    std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<torch::optim::OptimizerParamGroup>)>;

// The factory of any LibTorch optimizer constructed as OptimizerType(param_groups, options): SGD, Adam, AdamW,
// Adagrad, RMSprop. E.g. make_optimizer<torch::optim::SGD>(torch::optim::SGDOptions(0.1).momentum(0.9)).
template <typename OptimizerType, typename Options>
OptimizerFactory make_optimizer(Options options) {
  return [options](std::vector<torch::optim::OptimizerParamGroup> groups) -> std::unique_ptr<torch::optim::Optimizer> {
    return std::make_unique<OptimizerType>(std::move(groups), options);
  };
}

class ZeroRedundancyOptimizer : public torch::optim::Optimizer {
 public:
  // `communicator` null: a world of one, which owns everything. Every rank passes the same groups of parameters
  // of the same shapes (a replicated model's), so that all compute the same partition.
  ZeroRedundancyOptimizer(std::vector<torch::optim::OptimizerParamGroup> param_groups, OptimizerFactory make_optimizer,
                          comm::CommunicatorPtr communicator);
  ZeroRedundancyOptimizer(std::vector<torch::Tensor> parameters, OptimizerFactory make_optimizer,
                          comm::CommunicatorPtr communicator);

  // Steps this rank's parameters with its local optimizer (the closure, if any, runs there), then broadcasts every
  // rank's updated parameters. Drops the consolidated state, which no longer holds.
  torch::Tensor step(LossClosure closure = nullptr) override;

  // Collective: `root` gathers every rank's optimizer state into one optimizer of the local kind over all
  // parameters, which save() then writes. Each rank's state travels as its archive in one broadcast.
  void consolidate_state_dict(int root = 0);
  // Only on the root of consolidate_state_dict() since the last step(); InvalidArgument elsewhere.
  void save(torch::serialize::OutputArchive& archive) const override;
  // An archive of the local kind over all parameters (save()'s, or a plain optimizer's); each rank keeps the state
  // of the parameters it owns. Not collective.
  void load(torch::serialize::InputArchive& archive) override;

  // The optimizer over this rank's parameters: its state is this rank's share.
  const torch::optim::Optimizer& local_optimizer() const { return *local_; }
  // Over every parameter in param_groups() order (group by group).
  const ParameterPartition& partition() const { return partition_; }

 private:
  // One broadcast of step(): a rank's parameters of one dtype, in param_groups() order.
  struct Bucket {
    int owner = 0;
    std::vector<torch::Tensor> parameters;
    int64_t numel = 0;
  };

  std::vector<torch::Tensor> all_parameters() const;
  // param_groups() with only the parameters that `rank` owns, each group with its options.
  std::vector<torch::optim::OptimizerParamGroup> groups_owned_by(int rank) const;
  void broadcast_parameters();
  // Moves the state of `rank`'s parameters from `from` into `to`: both must hold them, whatever else they hold.
  void move_state(torch::optim::Optimizer& from, torch::optim::Optimizer& to, int rank) const;

  comm::CommunicatorPtr communicator_;
  int rank_ = 0;
  int world_ = 1;
  OptimizerFactory make_optimizer_;
  ParameterPartition partition_;
  std::unique_ptr<torch::optim::Optimizer> local_;
  std::vector<Bucket> buckets_;
  // On the root of the last consolidate_state_dict(), until the next step().
  std::unique_ptr<torch::optim::Optimizer> consolidated_;
};

}  // namespace tandem::optim
