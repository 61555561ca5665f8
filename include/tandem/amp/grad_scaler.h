#pragma once
// Loss scaling for float16 training, with the semantics and defaults of PyTorch's torch.amp.GradScaler (checked
// against it step by step: tests/fixtures/grad_scaler_pytorch.json). Gradients below float16's smallest value
// vanish; multiplying the loss by a large scale before backward keeps them, and the gradients are divided by
// it again before the optimizer uses them. A step whose gradients hold an inf or NaN is skipped and the scale
// backs off; growth_interval steps in a row without one grow it again.
//
//   tandem::amp::GradScaler scaler({}, communicator);  // communicator: every rank makes the same decision
//   scaler.scale(loss).backward();
//   scaler.unscale_(optimizer);                         // optional: gradients are true values from here on,
//   clip_grad_norm_(params, 1.0);                       // so clipping sees them
//   scaler.step(optimizer);                             // skipped when any gradient is not finite
//   scaler.update();                                    // once per iteration, after every optimizer's step
#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <cstdint>
#include <map>

#include "tandem/comm/communicator.h"

namespace tandem::amp {

struct GradScalerOptions {
  double init_scale = 65536.0;  // 2^16
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;  // steps without inf or NaN before the scale grows
  bool enabled = true;             // false: scale() returns the loss, step() just steps, update() does nothing
};

// PyTorch's state_dict: the current scale, the factors, and the count of steps since the last inf or NaN.
struct GradScalerState {
  double scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
  int64_t growth_tracker = 0;
};

class GradScaler {
 public:
  // With a communicator of several ranks, unscale_ is collective: a step is skipped on every rank when any
  // rank's gradients hold an inf or NaN. DDP's averaged gradients agree already, but gradients that were
  // never all-reduced (no DDP, a rank's own clipping, a hook that compresses) need not.
  explicit GradScaler(GradScalerOptions options = {}, comm::CommunicatorPtr communicator = nullptr);
  // The group a changed membership formed (in-job recovery): later steps decide among its ranks.
  void set_communicator(comm::CommunicatorPtr communicator) { communicator_ = std::move(communicator); }

  // loss times the scale (a one-element float32 tensor, as PyTorch returns); the loss itself when disabled.
  torch::Tensor scale(const torch::Tensor& loss) const;
  // Divides the gradients of `optimizer`'s parameters by the scale and records whether any is inf or NaN. At
  // most once per optimizer between update()s, before its step(). Float16 gradients are refused: autocast keeps
  // weights, and so their gradients, in float32.
  void unscale_(torch::optim::Optimizer& optimizer);
  // unscale_ unless done, then optimizer.step() unless a gradient was inf or NaN. Returns whether it stepped.
  bool step(torch::optim::Optimizer& optimizer);
  // Backs off or grows the scale from this iteration's steps; with new_scale, sets it instead.
  void update();
  void update(double new_scale);

  double get_scale() const;  // 1 when disabled
  bool is_enabled() const { return options_.enabled; }
  GradScalerState state_dict() const;
  void load_state_dict(const GradScalerState& state);

 private:
  enum class Stage { kReady, kUnscaled, kStepped };
  struct OptimizerRecord {
    Stage stage = Stage::kReady;
    bool found_inf = false;
  };

  GradScalerOptions options_;
  comm::CommunicatorPtr communicator_;
  // The scale is a float32, as in PyTorch, so that every product with it rounds the same way.
  float scale_;
  int64_t growth_tracker_ = 0;
  std::map<const torch::optim::Optimizer*, OptimizerRecord> this_iteration_;
};

}  // namespace tandem::amp
