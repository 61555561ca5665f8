#pragma once
// FullyShardedDataParallel: PyTorch FSDP2's fully_shard in C++ (ZeRO-3). Each rank keeps one shard of every
// unit's parameters, gradients and optimizer state; a unit's parameters are gathered just before its operators
// run and freed after, and its gradients are reduce-scattered, averaged, into the shards.
//
//   tandem::fsdp::FullyShardedDataParallel<Net> model(Net());                // collective, the default group
//   torch::optim::AdamW optimizer(model.parameters(), 1e-3);                 // steps on the shards
//   loss_fn(model(x), y).backward();                                         // shard grads averaged over ranks
//   tandem::fsdp::clip_grad_norm(model.sharded(), 1.0);                      // optional
//   optimizer.step();
//
// Like DDP's wrapper, a thin template over the module's holder (TORCH_MODULE type, Sequential, shared_ptr);
// the logic lives in ShardedModel. Outside forward and backward the wrapped module's parameters are placeholders
// (one zero broadcast to each parameter's shape): read the model through full_parameters(). Run the forward
// through this wrapper on every rank: its gathers are collectives. docs/fsdp.md has the design.
#include <torch/torch.h>

#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "tandem/comm/process_group.h"
#include "tandem/fsdp/fsdp_options.h"
#include "tandem/fsdp/sharded_model.h"

namespace tandem::fsdp {

template <typename ModuleType>
class FullyShardedDataParallel {
 public:
  // Collective, on the process group of init_process_group(), or a world of one if none was initialised (as
  // DistributedDataParallel's).
  explicit FullyShardedDataParallel(ModuleType module, FsdpOptions options = {})
      : FullyShardedDataParallel(std::move(module), tandem::default_communicator(), std::move(options)) {}

  // Collective. `communicator` may be null (a world of one); it must outlive this object. Move the model to its
  // device first: the shards are made next to the parameters.
  FullyShardedDataParallel(ModuleType module, comm::CommunicatorPtr communicator, FsdpOptions options = {})
      : module_(std::move(module)),
        sharded_(std::make_unique<ShardedModel>(*module_, std::move(communicator), std::move(options))) {}

  // Floating tensor arguments reach the module in the param dtype (FsdpOptions::mixed_precision); the output is
  // what the module returns, in the dtype it computed.
  template <typename... Args>
  auto forward(Args&&... args) {
    sharded_->before_forward();
    try {
      auto output = module_->forward(cast_input(std::forward<Args>(args))...);
      sharded_->after_forward();
      return output;
    } catch (...) {
      sharded_->abandon_forward();
      throw;
    }
  }

  template <typename... Args>
  auto operator()(Args&&... args) {
    return forward(std::forward<Args>(args)...);
  }

  // The shards, one per unit: hand these to the optimizer.
  std::vector<torch::Tensor> parameters() const { return sharded_->shards(); }
  // Collective: every parameter's full values, by its state dict name.
  std::vector<std::pair<std::string, torch::Tensor>> full_parameters() { return sharded_->gather_full_parameters(); }

  // Keep the guard alive across the forward and backward of each micro-batch that should not synchronise.
  [[nodiscard]] NoSyncGuard no_sync() { return NoSyncGuard(*sharded_); }

  void train(bool on = true) { module_->train(on); }
  void eval() { module_->eval(); }
  ModuleType& module() { return module_; }
  ShardedModel& sharded() { return *sharded_; }

 private:
  template <typename Arg>
  decltype(auto) cast_input(Arg&& arg) const {
    if constexpr (std::is_same_v<std::decay_t<Arg>, torch::Tensor>) {
      return sharded_->cast_forward_input(arg);
    } else {
      return std::forward<Arg>(arg);
    }
  }

  ModuleType module_;
  std::unique_ptr<ShardedModel> sharded_;
};

}  // namespace tandem::fsdp
