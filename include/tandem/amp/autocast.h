#pragma once
// Autocast for a scope, as PyTorch's `with torch.autocast(device_type, dtype)`: inside it, operations that
// gain from lower precision (convolutions, matrix products) run in `dtype`, and those that need float32's range
// (losses, softmax, norms' statistics) in float32; weights stay float32. What autocast does is per thread, so a
// thread the scope starts (DataParallel's replicas) must carry the setting over (current_autocast/Autocast).
//
//   tandem::amp::require_autocast(device, torch::kBFloat16);  // once: a clear error if it cannot run
//   {
//     tandem::amp::Autocast autocast(device.type(), torch::kBFloat16);
//     loss = loss_fn(model->forward(x), y);
//   }
//   loss.backward();                                           // outside: backward follows forward's dtypes
#include <torch/types.h>

#include "tandem/util/compat.h"

namespace tandem::amp {

// Throws UnsupportedError, in one line that says what to use instead, unless autocast on `device` runs
// `dtype` in this build of LibTorch: it checks the versions' rules (1.13's CPU autocast has no float16) and
// then runs one matrix product under autocast on the device, so a setting LibTorch would ignore or a device
// without the dtype is found before training starts rather than trained through in float32.
void require_autocast(const torch::Device& device, torch::ScalarType dtype);

class Autocast {
 public:
  // enabled false: autocast is off in the scope, as torch.autocast(enabled=False) (a part that needs float32).
  Autocast(c10::DeviceType device_type, torch::ScalarType dtype, bool enabled = true);
  ~Autocast();
  Autocast(const Autocast&) = delete;
  Autocast& operator=(const Autocast&) = delete;

 private:
  c10::DeviceType device_type_;
  compat::AutocastSetting previous_;
};

// This thread's autocast setting for CPU and CUDA, to hand to another thread.
struct AutocastSettings {
  compat::AutocastSetting cpu, cuda;
};
AutocastSettings current_autocast();
// Applies `settings` to this thread for the scope; a thread the caller started gets the caller's autocast.
class AutocastSettingsScope {
 public:
  explicit AutocastSettingsScope(const AutocastSettings& settings);
  ~AutocastSettingsScope();
  AutocastSettingsScope(const AutocastSettingsScope&) = delete;
  AutocastSettingsScope& operator=(const AutocastSettingsScope&) = delete;

 private:
  AutocastSettings previous_;
};

}  // namespace tandem::amp
