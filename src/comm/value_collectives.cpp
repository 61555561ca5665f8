#include "tandem/comm/value_collectives.h"

#include <cstring>

namespace tandem::comm {
namespace {

// `values` on the backend's device; the same tensor when it is there already, so no copy back is needed.
torch::Tensor staged(const Communicator& communicator, const torch::Tensor& values) {
  return values.device() == communicator.device() ? values : values.to(communicator.device());
}

}  // namespace

void all_reduce_values(Communicator& communicator, torch::Tensor& values, ReduceOp op) {
  torch::Tensor on_backend = staged(communicator, values);
  communicator.all_reduce(on_backend, op)->wait();
  if (!on_backend.is_same(values)) values.copy_(on_backend);
}

void broadcast_values(Communicator& communicator, torch::Tensor& values, int root) {
  torch::Tensor on_backend = staged(communicator, values);
  communicator.broadcast(on_backend, root)->wait();
  if (!on_backend.is_same(values)) values.copy_(on_backend);
}

std::vector<torch::Tensor> all_gather_values(Communicator& communicator, const torch::Tensor& values) {
  torch::Tensor input = staged(communicator, values);
  std::vector<torch::Tensor> outputs(communicator.world_size());
  for (auto& out : outputs) out = torch::empty_like(input);
  communicator.all_gather(outputs, input)->wait();
  for (auto& out : outputs) out = out.cpu();
  return outputs;
}

std::string broadcast_string(Communicator& communicator, const std::string& value, int root) {
  if (communicator.world_size() < 2) return value;
  torch::Tensor length = torch::tensor({static_cast<int64_t>(value.size())});
  broadcast_values(communicator, length, root);
  torch::Tensor bytes = torch::zeros({length.item<int64_t>()}, torch::kUInt8);
  if (communicator.rank() == root && !value.empty()) std::memcpy(bytes.data_ptr(), value.data(), value.size());
  if (bytes.numel() > 0) broadcast_values(communicator, bytes, root);
  return std::string(static_cast<const char*>(bytes.data_ptr()), static_cast<size_t>(bytes.numel()));
}

}  // namespace tandem::comm
