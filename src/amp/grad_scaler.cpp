#include "tandem/amp/grad_scaler.h"

#include <fmt/format.h>

#include <cmath>
#include <tuple>
#include <utility>
#include <vector>

#include "tandem/comm/value_collectives.h"
#include "tandem/util/compat.h"
#include "tandem/util/error.h"

namespace tandem::amp {
namespace {

void check_options(const GradScalerState& state) {
  if (!(state.scale > 0) || !std::isfinite(static_cast<float>(state.scale))) {
    throw InvalidArgument(fmt::format("GradScaler: the scale must be a positive float32, not {}", state.scale));
  }
  if (!(state.growth_factor > 1)) {
    throw InvalidArgument(fmt::format("GradScaler: growth_factor must be above 1, not {}", state.growth_factor));
  }
  if (!(state.backoff_factor > 0 && state.backoff_factor < 1)) {
    throw InvalidArgument(fmt::format("GradScaler: backoff_factor must be between 0 and 1, not {}", state.backoff_factor));
  }
  if (state.growth_interval < 1) {
    throw InvalidArgument(fmt::format("GradScaler: growth_interval must be at least 1, not {}", state.growth_interval));
  }
}

}  // namespace

GradScaler::GradScaler(GradScalerOptions options, comm::CommunicatorPtr communicator)
    : options_(options), communicator_(std::move(communicator)), scale_(static_cast<float>(options.init_scale)) {
  if (options_.enabled) {
    check_options({options_.init_scale, options_.growth_factor, options_.backoff_factor, options_.growth_interval, 0});
  }
}

torch::Tensor GradScaler::scale(const torch::Tensor& loss) const {
  if (!options_.enabled) return loss;
  return loss * torch::full({1}, scale_, loss.options().dtype(torch::kFloat32));
}

void GradScaler::unscale_(torch::optim::Optimizer& optimizer) {
  if (!options_.enabled) return;
  OptimizerRecord& record = this_iteration_[&optimizer];
  if (record.stage == Stage::kUnscaled) {
    throw InvalidArgument("GradScaler::unscale_ was already called for this optimizer since the last update()");
  }
  if (record.stage == Stage::kStepped) throw InvalidArgument("GradScaler::unscale_ is called after step()");

  // The fused kernel wants one device and dtype per call.
  std::map<std::tuple<c10::DeviceType, c10::DeviceIndex, torch::ScalarType>, std::vector<torch::Tensor>> groups;
  for (const auto& group : optimizer.param_groups()) {
    for (const auto& param : group.params()) {
      const torch::Tensor& grad = param.grad();
      if (!grad.defined()) continue;
      if (grad.scalar_type() == torch::kHalf) {
        throw InvalidArgument("GradScaler: a parameter's gradient is float16; keep the weights in float32 and let "
                              "autocast choose float16 for the operations that gain from it");
      }
      if (grad.is_sparse()) throw UnsupportedError("GradScaler does not support sparse gradients");
      groups[{grad.device().type(), grad.device().index(), grad.scalar_type()}].push_back(grad);
    }
  }
  // 1/scale in double, rounded to float32, as PyTorch computes it.
  const auto inv_scale = static_cast<float>(1.0 / static_cast<double>(scale_));
  torch::Tensor found_any = torch::zeros({1}, torch::kFloat32);
  for (auto& [key, grads] : groups) {
    const torch::Device device(std::get<0>(key), std::get<1>(key));
    torch::Tensor found_inf = torch::zeros({1}, torch::TensorOptions().dtype(torch::kFloat32).device(device));
    compat::unscale_and_check_finite(grads, found_inf, torch::full({1}, inv_scale, found_inf.options()));
    found_any += found_inf.cpu();
  }
  if (communicator_ && communicator_->world_size() > 1) {
    comm::all_reduce_values(*communicator_, found_any, comm::ReduceOp::Max);
  }
  record.found_inf = found_any.item<float>() > 0;
  record.stage = Stage::kUnscaled;
}

bool GradScaler::step(torch::optim::Optimizer& optimizer) {
  if (!options_.enabled) {
    optimizer.step();
    return true;
  }
  if (this_iteration_[&optimizer].stage == Stage::kStepped) {
    throw InvalidArgument("GradScaler::step was already called for this optimizer since the last update()");
  }
  if (this_iteration_[&optimizer].stage == Stage::kReady) unscale_(optimizer);
  OptimizerRecord& record = this_iteration_[&optimizer];
  record.stage = Stage::kStepped;
  if (record.found_inf) return false;
  optimizer.step();
  return true;
}

void GradScaler::update() {
  if (!options_.enabled) return;
  if (this_iteration_.empty()) {
    throw InvalidArgument("GradScaler::update: no step() or unscale_() since the last update(), so no gradients "
                          "were checked");
  }
  bool found_inf = false;
  for (const auto& [optimizer, record] : this_iteration_) found_inf = found_inf || record.found_inf;
  this_iteration_.clear();
  if (found_inf) {
    scale_ = static_cast<float>(scale_ * options_.backoff_factor);
    growth_tracker_ = 0;
    return;
  }
  if (++growth_tracker_ < options_.growth_interval) return;
  // Growth that would overflow float32 is not taken (an infinite scale would make every step inf).
  const auto grown = static_cast<float>(scale_ * options_.growth_factor);
  if (std::isfinite(grown)) scale_ = grown;
  growth_tracker_ = 0;
}

void GradScaler::update(double new_scale) {
  if (!options_.enabled) return;
  check_options({new_scale, options_.growth_factor, options_.backoff_factor, options_.growth_interval, 0});
  this_iteration_.clear();
  scale_ = static_cast<float>(new_scale);
}

double GradScaler::get_scale() const { return options_.enabled ? scale_ : 1.0; }

GradScalerState GradScaler::state_dict() const {
  return {scale_, options_.growth_factor, options_.backoff_factor, options_.growth_interval, growth_tracker_};
}

void GradScaler::load_state_dict(const GradScalerState& state) {
  check_options(state);
  scale_ = static_cast<float>(state.scale);
  options_.growth_factor = state.growth_factor;
  options_.backoff_factor = state.backoff_factor;
  options_.growth_interval = state.growth_interval;
  growth_tracker_ = state.growth_tracker;
  this_iteration_.clear();
}

}  // namespace tandem::amp
