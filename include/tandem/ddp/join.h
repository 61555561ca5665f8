#pragma once
// Uneven inputs, PyTorch's `with Join([model]):`. Ranks with fewer batches than others would otherwise wait in
// their next collective for peers that are still training, until the timeout:
//
//   tandem::ddp::Join join(model);                  // model: a DistributedDataParallel
//   for (auto& batch : my_batches) { ... loss.backward(); optimizer.step(); }
//   join.finish();                                  // collective: returns once every rank has finished
//
// In finish() a rank that ran out of data answers each synchronised iteration of the others (buffer
// broadcast, replica check, gradient all-reduces) with zero gradients; the reducer then averages over the
// ranks that trained in that iteration, not over the whole world. Once every rank is in finish(), all replicas
// copy the model of the last rank to stop (the most synchronised backwards; the highest such rank), so the
// ranks go on from equal weights. The optimizer state of the ranks that stopped early stays theirs.
//
// Everything else the training loop exchanges per step must be shadowed too: pass it as `shadow_step`, which
// runs after each shadowed iteration in which some rank still trained. SyncBatchNorm exchanges statistics
// inside forward, which a shadowing rank cannot answer: a model holding it is refused, as in PyTorch.
// Buffers follow rank 0 at each forward even after rank 0 stopped (then they stay as rank 0 left them).
#include <torch/nn/module.h>

#include <functional>

#include "tandem/ddp/distributed_data_parallel.h"
#include "tandem/ddp/reducer.h"

namespace tandem::ddp {

class Join {
 public:
  template <typename ModuleType>
  explicit Join(DistributedDataParallel<ModuleType>& model) : Join(*model.module(), model.reducer()) {}
  // Throws UnsupportedError when `module` holds a SyncBatchNorm.
  Join(const torch::nn::Module& module, Reducer& reducer);

  // Throws UnsupportedError, naming it, when `module` holds a layer a shadowing rank cannot answer for.
  static void require_joinable(const torch::nn::Module& module);

  // Collective; call once this rank has no more batches. Returns the rank whose replica every rank now holds.
  int finish(const std::function<void()>& shadow_step = nullptr);

 private:
  Reducer& reducer_;
  int64_t backwards_at_start_;
};

}  // namespace tandem::ddp
