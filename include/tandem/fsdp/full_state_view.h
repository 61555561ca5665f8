#pragma once
// FSDP's full state (docs/fsdp.md, "Training with the loop"): while a FullStateView lives, the module's parameters
// hold their full values and the optimizer holds the module's parameters, in the module's order, with the state
// the plain optimizer would have for them. That is what the usual checkpoint code (checkpoint/checkpoint.h) saves
// and loads, so a checkpoint of an fsdp run is an ordinary tandem checkpoint (DDP, `tandem train` and PyTorch read
// its weights), and one written by any run continues under fsdp on any world size. A program of its own saves
// with a view on every rank (rank 0 writes), and restores with a view, load_checkpoint on every rank, commit().
//
// A shard is a slice of its unit's flat vector, so the optimizer's per-element state of a shard (SGD's momentum,
// Adam's moments) is the same slice of the flat state: gathering it and cutting it at the parameters' offsets
// gives each parameter's state, and the reverse cut gives each rank its shard's. Scalars (Adam's step) are the
// same for every parameter of a unit. The padding's state is zero, as the padding's gradient always is.
//
// The view gathers the whole model and its state on every rank: a checkpoint of an fsdp run needs the memory of
// a DDP replica for that moment.
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <memory>
#include <vector>

#include "tandem/fsdp/parameter_use_watch.h"
#include "tandem/fsdp/sharded_model.h"

namespace tandem::fsdp {

// The module's parameters as a plain optimizer holds them: each tensor once, in the module's order. LibTorch's
// parameters() lists a tensor registered in two modules (a tied weight) under each of its names, where PyTorch's
// lists it once; an optimizer's archive with a tensor twice loads into a null state for it.
std::vector<torch::Tensor> unique_parameters(const torch::nn::Module& module);

// Throws InvalidArgument, one line, unless `optimizer` is of a kind whose state FullStateView can cut (SGD,
// Adam, AdamW, RMSprop) and holds one param group of exactly `module`'s parameters.
void require_fsdp_optimizer(const torch::optim::Optimizer& optimizer, torch::nn::Module& module);

// Points `optimizer` (require_fsdp_optimizer's) at `model`'s shards. Any state it holds for the module's
// parameters (a second fit()) is cut into this rank's shard state. Every rank calls it; it sends nothing.
void shard_optimizer(ShardedModel& model, torch::nn::Module& module, torch::optim::Optimizer& optimizer);

class FullStateView {
 public:
  // Collective: gathers every unit's parameters and shard state on every rank. While the view lives, this
  // thread's reads of the parameters (a checkpoint's) are the view's, not uses that would gather a unit.
  FullStateView(ShardedModel& model, torch::nn::Module& module, torch::optim::Optimizer& optimizer);
  // Back to the shards (no communication), unless keep() was called.
  ~FullStateView();
  FullStateView(const FullStateView&) = delete;
  FullStateView& operator=(const FullStateView&) = delete;

  // After the module's parameters and the optimizer's state were replaced (a checkpoint loaded): this rank's
  // shards and shard state take their pieces of them.
  void commit();
  // The module and the optimizer stay full (the end of a run, before the sharded model goes).
  void keep() { kept_ = true; }

 private:
  parameter_use_watch::Pause pause_;
  ShardedModel& model_;
  torch::optim::Optimizer& optimizer_;
  std::vector<torch::Tensor> module_parameters_;          // unique_parameters(): the plain optimizer's
  std::vector<std::vector<torch::Tensor>> placeholders_;  // per unit and parameter, what the sharded module held
  // Per unit, the shard's state, taken out of the optimizer while the module's parameters hold theirs.
  std::vector<std::unique_ptr<torch::optim::OptimizerParamState>> shard_states_;
  bool kept_ = false;
};

}  // namespace tandem::fsdp
