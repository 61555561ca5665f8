#include "tandem/fsdp/gradient_clipping.h"

#include <cmath>
#include <string>

#include "tandem/util/error.h"

namespace tandem::fsdp {

double clip_grad_norm(ShardedModel& model, double max_norm) {
  if (!(max_norm > 0)) {
    throw InvalidArgument("fsdp clip_grad_norm max_norm is " + std::to_string(max_norm) + "; it must be positive");
  }
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> grads;
  for (const torch::Tensor& shard : model.shards()) {
    if (shard.grad().defined()) grads.push_back(shard.grad());
  }
  // Summed in float64 on the communicator's device, so that the ranks' partial sums add without rounding.
  const torch::Device device = model.communicator() ? model.communicator()->device() : torch::Device(torch::kCPU);
  torch::Tensor squared = torch::zeros({1}, torch::TensorOptions().dtype(torch::kFloat64).device(device));
  for (const torch::Tensor& grad : grads) squared += grad.to(torch::kFloat64).pow(2).sum().to(device);
  if (model.communicator() && model.communicator()->world_size() > 1) model.communicator()->all_reduce(squared)->wait();
  const double norm = std::sqrt(squared.item<double>());
  const double coefficient = max_norm / (norm + 1e-6);
  if (coefficient < 1) {
    for (torch::Tensor& grad : grads) grad.mul_(coefficient);
  }
  return norm;
}

}  // namespace tandem::fsdp
