#include "tandem/nn/sync_batch_norm.h"

#include <cmath>

#include "tandem/comm/process_group.h"
#include "tandem/util/error.h"

namespace tandem::nn {
namespace {

using torch::Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Dimensions a per-channel statistic reduces over: all but dim 1 (channels).
std::vector<int64_t> reduce_dims(int64_t input_dim) {
  std::vector<int64_t> dims{0};
  for (int64_t d = 2; d < input_dim; ++d) dims.push_back(d);
  return dims;
}

// Statistics and gradient sums of float16/bfloat16 inputs are kept in float32 (as PyTorch does): a channel's
// mean or a sum over a batch in 8 to 11 bits of mantissa loses most of its digits.
torch::ScalarType statistics_type(const Tensor& input) {
  return input.scalar_type() == torch::kDouble ? torch::kDouble : torch::kFloat;
}

// [C] -> [1, C, 1, ...] so it broadcasts against an input of `input_dim` dimensions.
Tensor per_channel(const Tensor& values, int64_t input_dim) {
  std::vector<int64_t> shape(static_cast<size_t>(input_dim), 1);
  shape[1] = values.size(0);
  return values.view(shape);
}

// Carries the communicator from forward to backward through AutogradContext::saved_data, which holds IValues.
struct CommunicatorCapsule : torch::CustomClassHolder {
  explicit CommunicatorCapsule(comm::CommunicatorPtr c) : communicator(std::move(c)) {}
  comm::CommunicatorPtr communicator;
};

// Normalises with statistics computed (and all-reduced) by the caller; backward all-reduces the two per-channel
// gradient sums so the input gradient is that of BatchNorm over the global batch.
class SyncBatchNormFunction : public torch::autograd::Function<SyncBatchNormFunction> {
 public:
  static Tensor forward(AutogradContext* ctx, const Tensor& input, const Tensor& weight, const Tensor& bias,
                        const Tensor& mean, const Tensor& invstd, double total_count,
                        comm::CommunicatorPtr communicator) {
    ctx->save_for_backward({input, weight, mean, invstd});
    ctx->saved_data["total_count"] = total_count;
    ctx->saved_data["communicator"] = c10::IValue::make_capsule(c10::make_intrusive<CommunicatorCapsule>(communicator));
    // mean and invstd are in statistics_type(input); the arithmetic is done there and rounded once at the end.
    const int64_t dim = input.dim();
    Tensor scale = invstd * weight;
    Tensor shift = bias - mean * scale;
    return (input * per_channel(scale, dim) + per_channel(shift, dim)).to(input.scalar_type());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const variable_list saved = ctx->get_saved_variables();
    const Tensor &input = saved[0], &weight = saved[1], &mean = saved[2], &invstd = saved[3];
    const double total_count = ctx->saved_data["total_count"].toDouble();
    const auto capsule = ctx->saved_data["communicator"].toCapsule();
    comm::Communicator& communicator = *static_cast<CommunicatorCapsule*>(capsule.get())->communicator;

    const int64_t dim = input.dim();
    const std::vector<int64_t> dims = reduce_dims(dim);
    const torch::ScalarType accumulate = statistics_type(input);
    Tensor grad_out = (grad_outputs[0].defined() ? grad_outputs[0] : torch::zeros_like(input)).to(accumulate);
    Tensor centered = input.to(accumulate) - per_channel(mean, dim);
    Tensor sum_dy = grad_out.sum(dims);
    Tensor sum_dy_xmu = (grad_out * centered).sum(dims);

    Tensor grad_input, grad_weight, grad_bias;
    // Weight and bias gradients stay local (see the header): DDP's all-reduce combines them.
    if (ctx->needs_input_grad(1)) grad_weight = (sum_dy_xmu * invstd).to(weight.scalar_type());
    if (ctx->needs_input_grad(2)) grad_bias = sum_dy.to(weight.scalar_type());
    if (ctx->needs_input_grad(0)) {
      const int64_t channels = mean.size(0);
      Tensor sums = torch::cat({sum_dy, sum_dy_xmu});
      communicator.all_reduce(sums, comm::ReduceOp::Sum)->wait();
      Tensor mean_dy = sums.slice(0, 0, channels) / total_count;
      Tensor mean_dy_xmu = sums.slice(0, channels, 2 * channels) / total_count;
      Tensor gain = invstd * weight;
      grad_input = ((grad_out - per_channel(mean_dy, dim) - centered * per_channel(invstd * invstd * mean_dy_xmu, dim)) *
                    per_channel(gain, dim))
                       .to(input.scalar_type());
    }
    return {grad_input, grad_weight, grad_bias, Tensor(), Tensor(), Tensor(), Tensor()};
  }
};

comm::CommunicatorPtr resolve_communicator(const comm::CommunicatorPtr& explicit_communicator) {
  // Null without a default group: a world of one.
  return explicit_communicator ? explicit_communicator : tandem::default_communicator();
}

template <typename BatchNormImplType>
std::shared_ptr<SyncBatchNormImpl> convert_if(const std::shared_ptr<torch::nn::Module>& module,
                                              const comm::CommunicatorPtr& communicator) {
  auto batch_norm = std::dynamic_pointer_cast<BatchNormImplType>(module);
  if (!batch_norm) return nullptr;
  auto sync = std::make_shared<SyncBatchNormImpl>(batch_norm->options, communicator, *batch_norm);
  sync->train(batch_norm->is_training());
  return sync;
}

std::shared_ptr<SyncBatchNormImpl> convert_one(const std::shared_ptr<torch::nn::Module>& module,
                                               const comm::CommunicatorPtr& communicator) {
  if (auto sync = convert_if<torch::nn::BatchNorm1dImpl>(module, communicator)) return sync;
  if (auto sync = convert_if<torch::nn::BatchNorm2dImpl>(module, communicator)) return sync;
  return convert_if<torch::nn::BatchNorm3dImpl>(module, communicator);
}

}  // namespace

SyncBatchNormImpl::SyncBatchNormImpl(const torch::nn::BatchNormOptions& options_, comm::CommunicatorPtr communicator)
    : options(options_), communicator_(std::move(communicator)) {
  reset();
}

SyncBatchNormImpl::SyncBatchNormImpl(const torch::nn::BatchNormOptions& options_, comm::CommunicatorPtr communicator,
                                     const torch::nn::Module& batch_norm)
    : options(options_), communicator_(std::move(communicator)) {
  // named_parameters()/named_buffers() leave out the undefined tensors of a non-affine or non-tracking layer.
  const auto params = batch_norm.named_parameters(/*recurse=*/false);
  const auto buffers = batch_norm.named_buffers(/*recurse=*/false);
  const auto get = [](const torch::OrderedDict<std::string, Tensor>& dict, const char* name) {
    const Tensor* found = dict.find(name);
    return found ? *found : Tensor();
  };
  register_state(get(params, "weight"), get(params, "bias"), get(buffers, "running_mean"),
                 get(buffers, "running_var"), get(buffers, "num_batches_tracked"));
}

void SyncBatchNormImpl::reset() {
  const int64_t channels = options.num_features();
  const bool affine = options.affine(), tracking = options.track_running_stats();
  register_state(affine ? torch::empty({channels}) : Tensor(), affine ? torch::empty({channels}) : Tensor(),
                 tracking ? torch::zeros({channels}) : Tensor(), tracking ? torch::ones({channels}) : Tensor(),
                 tracking ? torch::tensor(0, torch::kLong) : Tensor());
  reset_parameters();
}

void SyncBatchNormImpl::register_state(Tensor weight_, Tensor bias_, Tensor running_mean_, Tensor running_var_,
                                       Tensor num_batches_tracked_) {
  TANDEM_CHECK(weight_.defined() == options.affine() && running_mean_.defined() == options.track_running_stats(),
               "SyncBatchNorm state does not match its options");
  weight = register_parameter("weight", std::move(weight_), /*requires_grad=*/options.affine());
  bias = register_parameter("bias", std::move(bias_), /*requires_grad=*/options.affine());
  running_mean = register_buffer("running_mean", std::move(running_mean_));
  running_var = register_buffer("running_var", std::move(running_var_));
  num_batches_tracked = register_buffer("num_batches_tracked", std::move(num_batches_tracked_));
}

void SyncBatchNormImpl::reset_running_stats() {
  if (!options.track_running_stats()) return;
  running_mean.zero_();
  running_var.fill_(1);
  num_batches_tracked.zero_();
}

void SyncBatchNormImpl::reset_parameters() {
  reset_running_stats();
  if (options.affine()) {
    torch::NoGradGuard no_grad;
    weight.fill_(1);
    bias.zero_();
  }
}

void SyncBatchNormImpl::pretty_print(std::ostream& stream) const {
  stream << "tandem::nn::SyncBatchNorm(" << options.num_features() << ", eps=" << options.eps() << ", momentum=";
  if (options.momentum()) {
    stream << *options.momentum();
  } else {
    stream << "None";
  }
  stream << ", affine=" << std::boolalpha << options.affine()
         << ", track_running_stats=" << options.track_running_stats() << ")";
}

Tensor SyncBatchNormImpl::forward(const Tensor& input) {
  if (input.dim() < 2 || input.size(1) != options.num_features()) {
    throw InvalidArgument(detail::concat("SyncBatchNorm(", options.num_features(), ") expects input [N, ",
                                         options.num_features(), ", *], got ", input.sizes()));
  }
  const bool use_batch_stats = is_training() || !options.track_running_stats();
  if (!use_batch_stats) {
    return torch::batch_norm(input, weight, bias, running_mean, running_var, /*training=*/false, 0.0, options.eps(),
                             /*cudnn_enabled=*/true);
  }

  // Same running-average factor as torch::nn::BatchNorm, including the cumulative average for momentum=None.
  double average_factor = options.momentum().value_or(0.0);
  if (is_training() && options.track_running_stats()) {
    num_batches_tracked += 1;
    if (!options.momentum()) average_factor = 1.0 / num_batches_tracked.item<double>();
  }

  // Only training synchronises. Evaluation without running statistics normalises each rank's batch by its
  // own statistics, as PyTorch's SyncBatchNorm does: evaluation is not collective (a rank may have fewer
  // batches than another), so a collective here could wait for a rank that never comes.
  const comm::CommunicatorPtr communicator = resolve_communicator(communicator_);
  if (!communicator || communicator->world_size() == 1 || !is_training()) {
    return torch::batch_norm(input, weight, bias, running_mean, running_var, /*training=*/true, average_factor,
                             options.eps(), /*cudnn_enabled=*/true);
  }

  const int64_t channels = options.num_features();
  const int64_t local_count = input.size(1) == 0 ? 0 : input.numel() / channels;
  Tensor mean, invstd;
  double total_count = 0;
  {
    torch::NoGradGuard no_grad;
    // One all-reduce of [count * mean, count * E[x^2], count] in float64 gives count-weighted global moments;
    // float64 keeps E[x^2] - mean^2 exact enough for float inputs.
    auto options64 = torch::TensorOptions().dtype(torch::kDouble).device(input.device());
    Tensor moments = torch::zeros({2 * channels + 1}, options64);
    if (local_count > 0) {
      auto [local_var, local_mean] = torch::var_mean(input.detach().to(statistics_type(input)),
                                                     reduce_dims(input.dim()), /*unbiased=*/false, /*keepdim=*/false);
      Tensor mean64 = local_mean.to(torch::kDouble);
      moments.slice(0, 0, channels).copy_(mean64 * static_cast<double>(local_count));
      moments.slice(0, channels, 2 * channels)
          .copy_((local_var.to(torch::kDouble) + mean64 * mean64) * static_cast<double>(local_count));
      moments[2 * channels].fill_(static_cast<double>(local_count));
    }
    communicator->all_reduce(moments, comm::ReduceOp::Sum)->wait();
    total_count = moments[2 * channels].item<double>();
    if (total_count <= 1) {
      throw InvalidArgument(detail::concat("SyncBatchNorm: expected more than 1 value per channel over all ranks "
                                           "when training, got ", total_count, " (input ", input.sizes(),
                                           " on this rank); use a larger batch"));
    }
    Tensor mean64 = moments.slice(0, 0, channels) / total_count;
    Tensor var64 = (moments.slice(0, channels, 2 * channels) / total_count - mean64 * mean64).clamp_min(0);
    mean = mean64.to(statistics_type(input));
    invstd = (var64 + options.eps()).rsqrt().to(statistics_type(input));
    if (options.track_running_stats()) {
      Tensor unbiased_var = var64 * (total_count / (total_count - 1));
      running_mean.mul_(1 - average_factor).add_(mean64.to(running_mean.scalar_type()), average_factor);
      running_var.mul_(1 - average_factor).add_(unbiased_var.to(running_var.scalar_type()), average_factor);
    }
  }
  // LibTorch 1.13's autograd functions reject undefined tensors, so a layer without affine parameters passes
  // the identity's (which need no gradient).
  const Tensor scale = weight.defined() ? weight : torch::ones({channels}, mean.options());
  const Tensor shift = bias.defined() ? bias : torch::zeros({channels}, mean.options());
  return SyncBatchNormFunction::apply(input, scale, shift, mean, invstd, total_count, communicator);
}

std::shared_ptr<torch::nn::Module> convert_sync_batchnorm(std::shared_ptr<torch::nn::Module> module,
                                                          comm::CommunicatorPtr communicator) {
  TANDEM_CHECK(module != nullptr, "convert_sync_batchnorm needs a module");
  if (auto sync = convert_one(module, communicator)) return sync;
  for (const auto& item : module->named_children()) {
    auto converted = convert_sync_batchnorm(item.value(), communicator);
    if (converted != item.value()) module->replace_module(item.key(), converted);
  }
  return module;
}

int count_sync_batchnorm(const torch::nn::Module& module) {
  int count = 0;
  for (const auto& child : module.modules(/*include_self=*/true)) {
    if (std::dynamic_pointer_cast<SyncBatchNormImpl>(child)) ++count;
  }
  return count;
}

bool has_batch_norm(const torch::nn::Module& module) {
  for (const auto& child : module.modules(/*include_self=*/true)) {
    if (std::dynamic_pointer_cast<SyncBatchNormImpl>(child) || std::dynamic_pointer_cast<torch::nn::BatchNorm1dImpl>(child) ||
        std::dynamic_pointer_cast<torch::nn::BatchNorm2dImpl>(child) ||
        std::dynamic_pointer_cast<torch::nn::BatchNorm3dImpl>(child)) {
      return true;
    }
  }
  return false;
}

Tensor forward_batch_norm(torch::nn::Module& layer, const Tensor& input) {
  if (auto* sync = dynamic_cast<SyncBatchNormImpl*>(&layer)) return sync->forward(input);
  if (auto* bn = dynamic_cast<torch::nn::BatchNorm2dImpl*>(&layer)) return bn->forward(input);
  if (auto* bn = dynamic_cast<torch::nn::BatchNorm1dImpl*>(&layer)) return bn->forward(input);
  if (auto* bn = dynamic_cast<torch::nn::BatchNorm3dImpl*>(&layer)) return bn->forward(input);
  throw InvalidArgument(detail::concat("forward_batch_norm: layer ", layer.name(),
                                       " is neither a BatchNorm nor a SyncBatchNorm"));
}

}  // namespace tandem::nn
