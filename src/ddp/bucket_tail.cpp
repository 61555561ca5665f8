#include "tandem/ddp/bucket_tail.h"

#include <torch/torch.h>

#include <algorithm>

namespace tandem::ddp {

void BucketTail::allocate(int world_size, size_t param_count, bool unused_search,
                          const std::optional<torch::Device>& last_bucket_device) {
  world_size_ = world_size;
  param_count_ = param_count;
  used_flags_ = unused_search;
  numel_ = 2 * int64_t{world_size} + (unused_search ? static_cast<int64_t>(param_count) : 0);
  torch::NoGradGuard no_grad;
  host_ = torch::zeros({numel_}, torch::kFloat);
  if (last_bucket_device && last_bucket_device->is_cuda()) host_ = host_.pin_memory();
  if (last_bucket_device) {
    wire_ = torch::zeros({numel_}, torch::TensorOptions().dtype(torch::kFloat).device(*last_bucket_device));
  }
}

torch::Tensor BucketTail::place(const torch::Tensor& last_bucket, int64_t payload_numel, bool plain_average_hook) {
  const torch::ScalarType dtype = last_bucket.scalar_type();
  rides_ = plain_average_hook && (dtype == torch::kFloat || dtype == torch::kDouble);
  last_bucket_ = last_bucket;
  payload_numel_ = payload_numel;
  return rides_ ? last_bucket : last_bucket.narrow(0, 0, payload_numel);
}

torch::Tensor BucketTail::on_wire() { return rides_ ? last_bucket_.narrow(0, payload_numel_, numel_) : wire_; }

void BucketTail::fill(int rank, bool unused_parameter_error, bool trained, const std::vector<char>& used_since_sync) {
  float* flags = host_.data_ptr<float>();
  std::fill(flags, flags + numel_, 0.0f);
  flags[rank] = unused_parameter_error ? 1.0f : 0.0f;
  flags[world_size_ + rank] = trained ? 1.0f : 0.0f;
  if (used_flags_) {
    for (size_t i = 0; i < param_count_; ++i) flags[2 * world_size_ + i] = used_since_sync[i] ? 1.0f : 0.0f;
  }
  torch::NoGradGuard no_grad;
  torch::Tensor wire = on_wire();
  wire.copy_(host_, /*non_blocking=*/wire.is_cuda());
}

void BucketTail::launch(comm::Communicator& communicator) {
  if (!rides_) work_ = communicator.all_reduce(wire_, comm::ReduceOp::Sum);
}

TailAgreement BucketTail::read() {
  torch::NoGradGuard no_grad;
  torch::Tensor tail = on_wire().to(torch::kCPU, torch::kFloat);
  const float* flags = tail.data_ptr<float>();
  TailAgreement agreement;
  for (int r = 0; r < world_size_; ++r) {
    if (flags[r] != 0.0f) agreement.ranks_missing.push_back(r);
    if (flags[world_size_ + r] != 0.0f) {
      ++agreement.trained_ranks;
      agreement.highest_trained_rank = r;
    }
  }
  if (used_flags_) {
    agreement.globally_used.resize(param_count_);
    for (size_t i = 0; i < param_count_; ++i) agreement.globally_used[i] = flags[2 * world_size_ + i] != 0.0f;
  }
  return agreement;
}

}  // namespace tandem::ddp
