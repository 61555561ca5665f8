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
// ranks that trained in that iteration, not over the whole world, and writes that mean into the .grad of every
// rank, the shadowing ones included (Reducer::shadow_iteration). Once every rank is in finish(), all replicas
// copy the model of the last rank to stop (the most synchronised backwards; the highest such rank), so the
// ranks go on from equal weights and buffers.
//
// Everything else the training loop does per step must be shadowed too: pass it as `shadow_step`, which runs
// after each shadowed iteration in which some rank still trained. This rank's .grad then holds the averaged
// gradient the trained ranks got, bit for bit: step the optimizer there, so that its state (momentum, Adam's
// moments) stays the trained ranks' and the next epoch starts from equal replicas and equal optimizers. The
// parameters no rank used keep their .grad, so clear the gradients there after the step (and before finish())
// as the trained ranks clear theirs before each backward. Collectives of the loop's own step (a loss
// all-reduce) belong there as well. SyncBatchNorm exchanges statistics inside forward, which a shadowing rank
// cannot answer: a model holding it is refused, as in PyTorch.
//
// Buffers (BatchNorm's running statistics): while a Join is open, each synchronised forward broadcasts them from
// the highest rank that trained in the previous synchronised iteration, not from rank 0, which may have stopped
// and hold stale statistics. The statistics then take one batch per step, that of the highest rank that had a
// batch in that step, and no step's update is lost. PyTorch broadcasts from the highest rank still training,
// found with an all-reduce per forward; here the previous iteration's gradient all-reduce already says who
// trained, and that rank's buffers are as fresh even if it has just stopped.
#include <torch/nn/module.h>

#include <functional>

#include "tandem/ddp/distributed_data_parallel.h"
#include "tandem/ddp/reducer.h"

namespace tandem::ddp {

class Join {
 public:
  // Every rank opens its Join before its first forward of the uneven loop.
  template <typename ModuleType>
  explicit Join(DistributedDataParallel<ModuleType>& model) : Join(*model.module(), model.reducer()) {}
  // Throws UnsupportedError when `module` holds a SyncBatchNorm.
  Join(const torch::nn::Module& module, Reducer& reducer);
  ~Join();
  Join(const Join&) = delete;
  Join& operator=(const Join&) = delete;

  // Throws UnsupportedError, naming it, when `module` holds a layer a shadowing rank cannot answer for.
  static void require_joinable(const torch::nn::Module& module);

  // Collective; call once this rank has no more batches. Runs shadow_step (when given) after each iteration of
  // the others that this rank shadowed, with this rank's .grad holding that iteration's averaged gradient.
  // Returns the rank whose replica (parameters and buffers) every rank now holds; buffers follow rank 0 again.
  int finish(const std::function<void()>& shadow_step = nullptr);

 private:
  Reducer& reducer_;
  int64_t backwards_at_start_;
};

}  // namespace tandem::ddp
