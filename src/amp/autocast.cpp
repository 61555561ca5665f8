#include "tandem/amp/autocast.h"

#include <ATen/autocast_mode.h>
#include <fmt/format.h>
#include <torch/torch.h>

#include "tandem/util/error.h"

namespace tandem::amp {
namespace {

std::string dtype_name(torch::ScalarType dtype) {
  if (dtype == torch::kHalf) return "float16";
  return dtype == torch::kBFloat16 ? "bfloat16" : c10::toString(dtype);
}

}  // namespace

void require_autocast(const torch::Device& device, torch::ScalarType dtype) {
  const std::string where = fmt::format("autocast to {} on {} with LibTorch {}", dtype_name(dtype), device.str(),
                                        TORCH_VERSION);
  if (!compat::autocast_knows(device.type())) {
    throw UnsupportedError(where + ": tandem runs autocast on cpu and cuda only; use `precision` 32 there");
  }
  if (!compat::autocast_can_run(device.type(), dtype)) {
    throw UnsupportedError(where + " is not supported (1.13's CPU autocast knows only bfloat16): use `precision` "
                                   "bf16-mixed, or a LibTorch 2.x build");
  }
  torch::ScalarType produced = torch::kFloat32;
  try {
    Autocast autocast(device.type(), dtype);
    const torch::Tensor a = torch::ones({2, 2}, torch::TensorOptions().device(device));
    produced = torch::mm(a, a).scalar_type();
  } catch (const c10::Error& error) {
    throw UnsupportedError(where + " failed: " + error.what_without_backtrace() + "; use `precision` 32");
  }
  if (produced != dtype) {
    throw UnsupportedError(fmt::format("{}: a matrix product came out as {}, so LibTorch would train in float32; "
                                       "use `precision` 32",
                                       where, c10::toString(produced)));
  }
}

Autocast::Autocast(c10::DeviceType device_type, torch::ScalarType dtype, bool enabled) : device_type_(device_type) {
  if (enabled && !compat::autocast_can_run(device_type, dtype)) {
    throw UnsupportedError(fmt::format("autocast to {} on {} is not supported by LibTorch {}", dtype_name(dtype),
                                       c10::DeviceTypeName(device_type, /*lower_case=*/true), TORCH_VERSION));
  }
  previous_ = compat::autocast_setting(device_type);
  compat::set_autocast_setting(device_type, {enabled, enabled ? dtype : previous_.dtype});
  at::autocast::increment_nesting();
}

Autocast::~Autocast() {
  // Casts of weights are cached for the outermost scope only: the next step's weights are new values.
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  compat::set_autocast_setting(device_type_, previous_);
}

AutocastSettings current_autocast() {
  return {compat::autocast_setting(c10::DeviceType::CPU), compat::autocast_setting(c10::DeviceType::CUDA)};
}

AutocastSettingsScope::AutocastSettingsScope(const AutocastSettings& settings) : previous_(current_autocast()) {
  compat::set_autocast_setting(c10::DeviceType::CPU, settings.cpu);
  compat::set_autocast_setting(c10::DeviceType::CUDA, settings.cuda);
}

AutocastSettingsScope::~AutocastSettingsScope() {
  // Weight casts cached on this thread belong to the caller's step, not to whatever this thread runs next.
  at::autocast::clear_cache();
  compat::set_autocast_setting(c10::DeviceType::CPU, previous_.cpu);
  compat::set_autocast_setting(c10::DeviceType::CUDA, previous_.cuda);
}

}  // namespace tandem::amp
