#pragma once
// DataParallel: the C++ counterpart of torch.nn.DataParallel, data parallelism inside one process.
//
//   tandem::dp::DataParallel model(Net(), {{torch::kCPU, torch::kCPU, torch::kCPU}});  // or cuda:0, cuda:1, ...
//   torch::optim::SGD optimizer(model.module().parameters(), 0.1);
//   auto loss = loss_fn(model(x), y);   // x is split along dim 0 over the replicas, the outputs joined again
//   loss.backward();                     // .grad of the original's parameters: the whole batch's gradient
//   optimizer.step();
//
// The life cycle, which docs/data_parallel.md explains at length:
//   construction  replica 0 is the original model itself; replicas 1..N-1 are deep copies (ModelHolder::clone),
//                 made once, each with one thread of its own for the life of this object.
//   forward(x)    x is cut into N chunks along dim 0 and each is moved to its replica's device; every copy is
//                 re-bound to the original's current parameters (their values, and autograd edges back to them)
//                 and buffers (copied), and takes the original's train/eval mode; each replica's thread runs its
//                 forward under the caller's thread-local state (grad mode, inference mode, autocast); the outputs
//                 are joined on the output device.
//   backward      autograd carries each replica's parameter gradient to the original parameter, where it sums
//                 them: .grad holds the gradient of the joined output's loss, as one model on the whole batch.
// Buffers as in PyTorch: replica 0 works on the original's, so BatchNorm's running statistics follow replica 0's
// chunk; the copies' updates are lost. The split and the join are differentiable, so the input's gradient flows.
// One forward at a time: forward() is not reentrant.
//
// tandem's ddp::DistributedDataParallel is the faster way to use several devices or cores (BENCHMARKS.md):
// DataParallel re-binds (across devices: copies) the parameters every step and runs the whole backward from one
// thread.
#include <torch/nn/module.h>
#include <torch/types.h>

#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "tandem/nn/model_holder.h"

namespace tandem::dp {

struct DataParallelOptions {
  // One replica on each; a device may repeat (several CPU replicas are threads sharing the cores). The model's
  // parameters and buffers must be on devices[0] when forward() runs.
  std::vector<torch::Device> devices;
  // Where forward() returns the output; devices[0] when unset.
  std::optional<torch::Device> output_device;
};

// `count` replicas for a model on `device`: cuda:0 .. cuda:count-1 on a GPU (count 0: every visible GPU), else
// `count` replicas on `device` (0: one per intra-op thread of the calling thread). Throws InvalidArgument for
// more GPUs than are visible.
std::vector<torch::Device> replica_devices(const torch::Device& device, int count);

class ReplicaThread;
struct ReplicaCopy;

class DataParallel {
 public:
  // `model`: anything nn::hold_model takes (a TORCH_MODULE holder, std::shared_ptr<Module>, AnyModule); its
  // module and every module in it must be a torch::nn::Cloneable. Throws InvalidArgument for an empty device list
  // or a model that cannot be copied.
  template <typename Model>
  DataParallel(Model model, DataParallelOptions options)
      : DataParallel(nn::hold_model(std::move(model)), std::move(options)) {}
  DataParallel(nn::ModelHolder model, DataParallelOptions options);
  // Stops and joins the replica threads, idle between forwards.
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  // `input` [B, ...] with B >= 1; a batch smaller than the number of devices uses the first B replicas. Chunk
  // sizes differ by at most one, larger first (7 over 3: 3, 2, 2). Throws InvalidArgument for a 0-dim or empty
  // input or a model that is not on devices[0], and Error naming the replica and device when a replica's forward
  // throws.
  torch::Tensor forward(const torch::Tensor& input);
  torch::Tensor operator()(const torch::Tensor& input) { return forward(input); }

  // The original model (PyTorch's `dp.module`): its parameters receive the gradients; train it, save it.
  torch::nn::Module& module() const { return *model_; }
  const std::vector<torch::Device>& devices() const { return devices_; }

 private:
  // Points the copy's parameters at the original's (see compat::stand_in_for), copies the buffers over and gives
  // each of its modules the train/eval mode of the original's counterpart.
  void rebind(ReplicaCopy& copy, bool track_gradient);

  nn::ModelHolder model_;
  std::vector<torch::Device> devices_;
  torch::Device output_device_;
  std::vector<ReplicaCopy> copies_;                      // replicas 1..N-1
  std::vector<std::unique_ptr<ReplicaThread>> threads_;  // one per replica, 0..N-1
};

}  // namespace tandem::dp
