#include "tandem/fsdp/flat_unit.h"

#include <fmt/format.h>

#include "tandem/fsdp/parameter_use_watch.h"
#include "tandem/util/error.h"

namespace tandem::fsdp {
namespace {

using parameter_use_watch::Pause;

std::string unit_label(const std::string& name) { return name.empty() ? "the root unit" : "unit " + name; }

// An all-gather only moves bytes, so bfloat16 travels as float16 words, which every backend gathers (1.13's Gloo
// gathers no bfloat16: "backend gloo does not support BFloat16 tensors in all_gather").
torch::Tensor as_gathered_words(const torch::Tensor& tensor) {
  return tensor.scalar_type() == torch::kBFloat16 ? tensor.view(torch::kHalf) : tensor;
}

}  // namespace

FlatUnit::FlatUnit(UnitSpec spec, comm::Communicator* communicator, torch::ScalarType param_dtype,
                   torch::ScalarType reduce_dtype)
    : name_(std::move(spec.name)), communicator_(communicator), param_dtype_(param_dtype), reduce_dtype_(reduce_dtype) {
  if (communicator_) {
    rank_ = communicator_->rank();
    world_size_ = communicator_->world_size();
  }
  Pause pause;
  torch::NoGradGuard no_grad;
  TANDEM_CHECK(!spec.parameters.empty(), "fsdp unit without parameters");
  const torch::Device device = spec.parameters.front().second.device();
  for (auto& [name, tensor] : spec.parameters) {
    if (tensor.scalar_type() != torch::kFloat32) {
      throw UnsupportedError(fmt::format(
          "fsdp shards float32 parameters only, but {} is {}; keep the model in float32 and compute in a lower "
          "precision through FsdpOptions::mixed_precision",
          name, c10::toString(tensor.scalar_type())));
    }
    if (!tensor.requires_grad()) {
      throw UnsupportedError(fmt::format(
          "fsdp shards trainable parameters only, but {} does not require grad; unfreeze it or keep it out of "
          "the model that fsdp wraps",
          name));
    }
    if (tensor.device() != device) {
      throw InvalidArgument(fmt::format("fsdp {} has parameters on {} and {} ({}); move the model to one device",
                                        unit_label(name_), device.str(), tensor.device().str(), name));
    }
    parameters_.push_back({name, tensor, tensor.sizes().vec(), numel_, tensor.numel()});
    numel_ += tensor.numel();
  }
  padded_numel_ = (numel_ + world_size_ - 1) / world_size_ * world_size_;
  const auto options = torch::TensorOptions().dtype(torch::kFloat32).device(device);
  torch::Tensor flat = torch::zeros({padded_numel_}, options);
  for (const Parameter& parameter : parameters_) {
    flat.narrow(0, parameter.offset, parameter.numel).copy_(parameter.tensor.reshape(-1));
  }
  if (communicator_ && world_size_ > 1) communicator_->broadcast(flat, 0)->wait();
  const int64_t shard_numel = padded_numel_ / world_size_;
  shard_ = flat.narrow(0, rank_ * shard_numel, shard_numel).clone().requires_grad_(true);
  placeholder_ = torch::zeros({1}, options.dtype(param_dtype_));
  // Unsharded on the broadcast values first, so that a parameter never keeps this rank's own start.
  gathered_ = flat.to(param_dtype_);
  unsharded_ = true;
  for (const Parameter& parameter : parameters_) {
    parameter.tensor.set_data(gathered_.narrow(0, parameter.offset, parameter.numel).view(parameter.shape));
  }
  reshard();
}

int64_t FlatUnit::unsharded_bytes() const {
  return padded_numel_ * static_cast<int64_t>(c10::elementSize(param_dtype_));
}

int64_t FlatUnit::held_parameter_bytes() const {
  int64_t bytes = 0;
  if (gathered_.defined()) bytes += unsharded_bytes();
  if (in_flight_.defined()) bytes += unsharded_bytes();
  return bytes;
}

int64_t FlatUnit::held_gradient_bytes() const {
  int64_t bytes = 0;
  for (const Parameter& parameter : parameters_) {
    if (parameter.tensor.grad().defined()) bytes += parameter.tensor.grad().nbytes();
  }
  if (accumulated_.defined()) bytes += accumulated_.nbytes();
  if (reduction_input_.defined()) bytes += reduction_input_.nbytes() + reduction_output_.nbytes();
  return bytes;
}

void FlatUnit::start_gather() {
  if (unsharded_ || in_flight_.defined()) return;
  Pause pause;
  torch::NoGradGuard no_grad;
  in_flight_ = torch::empty({padded_numel_}, shard_.options().dtype(param_dtype_).requires_grad(false));
  ++gathers_started_;
  if (communicator_ && world_size_ > 1) {
    torch::Tensor received = as_gathered_words(in_flight_);
    gather_work_ = communicator_->all_gather_into(received, as_gathered_words(shard_.detach().to(param_dtype_)));
  } else {
    in_flight_.copy_(shard_.detach());
  }
}

void FlatUnit::unshard() {
  if (unsharded_) return;
  start_gather();
  Pause pause;
  if (gather_work_) std::exchange(gather_work_, nullptr)->wait();
  gathered_ = std::exchange(in_flight_, torch::Tensor());
  for (const Parameter& parameter : parameters_) {
    parameter.tensor.set_data(gathered_.narrow(0, parameter.offset, parameter.numel).view(parameter.shape));
  }
  unsharded_ = true;
}

void FlatUnit::reshard() {
  Pause pause;
  if (gather_work_) std::exchange(gather_work_, nullptr)->wait();
  in_flight_ = torch::Tensor();
  if (!unsharded_) return;
  for (const Parameter& parameter : parameters_) parameter.tensor.set_data(placeholder_.expand(parameter.shape));
  gathered_ = torch::Tensor();
  unsharded_ = false;
}

void FlatUnit::move_gradients_into(torch::Tensor& flat) {
  for (const Parameter& parameter : parameters_) {
    torch::Tensor& grad = parameter.tensor.mutable_grad();
    if (!grad.defined()) continue;
    flat.narrow(0, parameter.offset, parameter.numel).add_(grad.reshape(-1));
    grad = torch::Tensor();
  }
}

void FlatUnit::accumulate_gradients() {
  Pause pause;
  torch::NoGradGuard no_grad;
  if (!accumulated_.defined()) {
    accumulated_ = torch::zeros({padded_numel_}, shard_.options().dtype(reduce_dtype_).requires_grad(false));
  }
  move_gradients_into(accumulated_);
}

void FlatUnit::start_gradient_reduction() {
  Pause pause;
  torch::NoGradGuard no_grad;
  TANDEM_CHECK(!reduction_work_ && !reduction_input_.defined(), "fsdp ", unit_label(name_),
               " reduces its gradients twice in one backward");
  reduction_input_ = accumulated_.defined()
                         ? std::exchange(accumulated_, torch::Tensor())
                         : torch::zeros({padded_numel_}, shard_.options().dtype(reduce_dtype_).requires_grad(false));
  move_gradients_into(reduction_input_);
  if (communicator_ && world_size_ > 1) {
    reduction_output_ = torch::empty({padded_numel_ / world_size_}, reduction_input_.options());
    reduction_work_ = communicator_->reduce_scatter(reduction_output_, reduction_input_, comm::ReduceOp::Avg);
  } else {
    reduction_output_ = reduction_input_;
  }
}

void FlatUnit::finish_gradient_reduction(bool into_shard) {
  if (!reduction_output_.defined()) return;
  torch::NoGradGuard no_grad;
  if (reduction_work_) std::exchange(reduction_work_, nullptr)->wait();
  // Where no rank used the unit, its shard's gradient stays as it was: undefined after zero_grad(set_to_none), so
  // that the optimizer skips the shard as it skips an unused parameter.
  if (into_shard) {
    torch::Tensor& grad = shard_.mutable_grad();
    if (grad.defined()) {
      grad.add_(reduction_output_);
    } else {
      grad = reduction_output_.to(torch::kFloat32);
    }
  }
  reduction_input_ = torch::Tensor();
  reduction_output_ = torch::Tensor();
}

torch::Tensor FlatUnit::gather_now() {
  torch::NoGradGuard no_grad;
  torch::Tensor full = torch::empty({padded_numel_}, shard_.options().requires_grad(false));
  if (communicator_ && world_size_ > 1) {
    communicator_->all_gather_into(full, shard_.detach())->wait();
  } else {
    full.copy_(shard_.detach());
  }
  return full;
}

std::vector<std::pair<std::string, torch::Tensor>> FlatUnit::gather_copies() {
  Pause pause;
  const torch::Tensor full = gather_now();
  std::vector<std::pair<std::string, torch::Tensor>> copies;
  for (const Parameter& parameter : parameters_) {
    copies.emplace_back(parameter.name, full.narrow(0, parameter.offset, parameter.numel).view(parameter.shape).clone());
  }
  return copies;
}

}  // namespace tandem::fsdp
