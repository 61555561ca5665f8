#pragma once
// SyncBatchNorm: batch normalisation whose training statistics cover the global batch, i.e. every rank's
// local batch together (PyTorch's torch.nn.SyncBatchNorm). Ranks may hold different batch sizes; the mean and
// variance are weighted by each rank's element count, so the result equals BatchNorm on the concatenation of
// all ranks' batches.
//
// Contracts:
// - In training mode, forward() and backward() each run one collective on the communicator, so every rank must
//   call forward on the same layers in the same order, and backward likewise (as with any collective).
// - The gradient w.r.t. the input is the global one. The gradients of weight and bias are this rank's share
//   (as in PyTorch): their SUM over ranks is BatchNorm's gradient on the concatenated batch, which is what DDP's
//   gradient all-reduce produces (DDP averages; the loss each rank differentiates is its own share too).
// - Running statistics are updated identically on every rank, with the unbiased variance of the global batch.
// - Eval mode (with running statistics) communicates nothing; a world of one is exactly torch::nn::BatchNorm.
#include <torch/torch.h>

#include <memory>

#include "tandem/comm/communicator.h"

namespace tandem::nn {

class SyncBatchNormImpl : public torch::nn::Cloneable<SyncBatchNormImpl> {
 public:
  // `communicator` null: use the default process group (tandem/comm/process_group.h) at each forward, or a
  // world of one before init_process_group(); so a model can be built before the group exists.
  explicit SyncBatchNormImpl(const torch::nn::BatchNormOptions& options, comm::CommunicatorPtr communicator = nullptr);
  explicit SyncBatchNormImpl(int64_t num_features, comm::CommunicatorPtr communicator = nullptr)
      : SyncBatchNormImpl(torch::nn::BatchNormOptions(num_features), std::move(communicator)) {}
  // Holds the very parameter and buffer tensors of `batch_norm` (a BatchNorm built with `options`), not copies,
  // so that state and optimizer references carry over. Used by convert_sync_batchnorm.
  SyncBatchNormImpl(const torch::nn::BatchNormOptions& options, comm::CommunicatorPtr communicator,
                    const torch::nn::Module& batch_norm);

  // Input [N, C] or [N, C, *] (1d, 2d and 3d alike); N may differ between ranks, and may be 0 on some.
  torch::Tensor forward(const torch::Tensor& input);

  void reset() override;
  void reset_running_stats();
  void reset_parameters();
  void pretty_print(std::ostream& stream) const override;

  const comm::CommunicatorPtr& communicator() const { return communicator_; }
  void set_communicator(comm::CommunicatorPtr communicator) { communicator_ = std::move(communicator); }


  torch::nn::BatchNormOptions options;
  // Same names and meaning as torch::nn::BatchNorm's, so state dicts and checkpoints carry over.
  torch::Tensor weight;
  torch::Tensor bias;
  torch::Tensor running_mean;
  torch::Tensor running_var;
  torch::Tensor num_batches_tracked;

 private:
  void register_state(torch::Tensor weight, torch::Tensor bias, torch::Tensor running_mean, torch::Tensor running_var,
                      torch::Tensor num_batches_tracked);

  comm::CommunicatorPtr communicator_;
};
TORCH_MODULE(SyncBatchNorm);

// Replaces every torch::nn::BatchNorm1d/2d/3d in the tree under `module` by a SyncBatchNorm with the same
// options, parameters, running statistics and registered name, and returns the root (a new SyncBatchNorm if the
// root itself is a BatchNorm). Parameters are moved, not copied: an optimizer built before the call still
// updates them. Call it before wrapping the model in DDP and before building the optimizer, like PyTorch.
// Only forward() implementations that look their norm layers up by name see the change (see
// forward_batch_norm below; tandem::nn::ResNet does); a module holding a typed BatchNorm2d member keeps calling
// the old layer.
std::shared_ptr<torch::nn::Module> convert_sync_batchnorm(std::shared_ptr<torch::nn::Module> module,
                                                          comm::CommunicatorPtr communicator = nullptr);

// Number of SyncBatchNorm layers in the tree (a cheap check that a conversion happened).
int count_sync_batchnorm(const torch::nn::Module& module);

// Whether the tree under `module` holds a BatchNorm1d/2d/3d or a SyncBatchNorm: layers that train on their batch's
// own statistics, which need more than one value per channel.
bool has_batch_norm(const torch::nn::Module& module);

// Runs `layer`, which must be a torch::nn::BatchNorm1d/2d/3d or a SyncBatchNorm; throws InvalidArgument
// otherwise. Models call their norm layers through this so that convert_sync_batchnorm can swap them.
torch::Tensor forward_batch_norm(torch::nn::Module& layer, const torch::Tensor& input);

}  // namespace tandem::nn
