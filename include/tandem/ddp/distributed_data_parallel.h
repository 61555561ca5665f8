#pragma once
// DistributedDataParallel: the C++ counterpart of torch.nn.parallel.DistributedDataParallel.
//
//   auto model = tandem::ddp::DistributedDataParallel<Net>(Net(), options);   // Net = TORCH_MODULE holder
//   torch::optim::SGD optimizer(model.parameters(), 0.1);
//   auto loss = loss_fn(model.forward(x), y);   // or model(x)
//   loss.backward();                             // returns with .grad averaged over all ranks
//   optimizer.step();
//   torch::save(model.module(), "ckpt.pt");      // the wrapped model, like model.module in Python
//
// torch::nn::Module has no virtual forward, so the wrapper is a thin template over the module's holder (a
// TORCH_MODULE type, torch::nn::Sequential, ...) or a std::shared_ptr<SomeModule>; all logic lives in the
// non-template Reducer. Construction is collective: every rank must wrap the same model with the same options.
// Move the model to its device before wrapping it: the gradient buckets are allocated next to the parameters.
#include <torch/torch.h>

#include <memory>
#include <type_traits>
#include <utility>

#include "tandem/comm/process_group.h"
#include "tandem/ddp/comm_hook.h"
#include "tandem/ddp/ddp_options.h"
#include "tandem/ddp/no_sync_guard.h"
#include "tandem/ddp/reducer.h"

namespace tandem::ddp {

template <typename ModuleType>
class DistributedDataParallel {
 public:
  // Uses the process group of init_process_group(), or a world of one if none was initialised.
  explicit DistributedDataParallel(ModuleType module, DdpOptions options = {})
      : DistributedDataParallel(std::move(module), tandem::default_communicator(), std::move(options)) {}

  // `communicator` may be null (a world of one); it must outlive this object.
  DistributedDataParallel(ModuleType module, comm::CommunicatorPtr communicator, DdpOptions options = {})
      : module_(std::move(module)) {
    torch::nn::Module& base = *module_;
    reducer_ = std::make_unique<Reducer>(base.named_parameters(), base.named_buffers(), std::move(communicator),
                                         std::move(options));
  }

  // Broadcasts buffers from rank 0 (when on), then runs the wrapped module's forward. A tensor output is
  // watched, so that a backward through it always ends in the gradient all-reduces (see Reducer::watch_output).
  template <typename... Args>
  auto forward(Args&&... args) {
    reducer_->prepare_for_forward();
    auto output = module_->forward(std::forward<Args>(args)...);
    if constexpr (std::is_same_v<decltype(output), torch::Tensor>) reducer_->watch_output(output);
    return output;
  }
  template <typename... Args>
  auto operator()(Args&&... args) {
    return forward(std::forward<Args>(args)...);
  }

  // The wrapped model (PyTorch's `ddp.module`): save it, call its own methods. A forward and backward through it
  // bypass DDP on this rank alone (an input gradient, a probe): nothing is communicated, and the backward adds
  // this rank's own gradients to .grad, so clear the gradients before the wrapper's next backward, as a training
  // loop does before each step anyway.
  ModuleType& module() { return module_; }
  const ModuleType& module() const { return module_; }

  std::vector<torch::Tensor> parameters(bool recurse = true) const { return base().parameters(recurse); }
  torch::OrderedDict<std::string, torch::Tensor> named_parameters(bool recurse = true) const {
    return base().named_parameters(recurse);
  }
  void train(bool on = true) { base().train(on); }
  void eval() { base().eval(); }
  bool is_training() const { return base().is_training(); }

  // Keep the guard alive across forward and backward of each micro-batch that should not synchronise.
  [[nodiscard]] NoSyncGuard no_sync() { return NoSyncGuard(*reducer_); }
  void register_comm_hook(CommHookPtr hook) { reducer_->register_comm_hook(std::move(hook)); }
  Reducer& reducer() { return *reducer_; }

 private:
  const torch::nn::Module& base() const { return *module_; }
  torch::nn::Module& base() { return *module_; }

  ModuleType module_;
  std::unique_ptr<Reducer> reducer_;
};

}  // namespace tandem::ddp
