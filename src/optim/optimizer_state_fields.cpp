#include "tandem/optim/optimizer_state_fields.h"

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include "tandem/util/error.h"

namespace tandem::optim {

using torch::optim::OptimizerParamState;

bool has_state_fields(const OptimizerParamState& state) {
  return dynamic_cast<const torch::optim::SGDParamState*>(&state) ||
         dynamic_cast<const torch::optim::AdamParamState*>(&state) ||
         dynamic_cast<const torch::optim::AdamWParamState*>(&state) ||
         dynamic_cast<const torch::optim::RMSpropParamState*>(&state);
}

std::vector<std::string> state_field_names(const OptimizerParamState& state) {
  if (dynamic_cast<const torch::optim::SGDParamState*>(&state)) return {"momentum_buffer"};
  if (dynamic_cast<const torch::optim::AdamParamState*>(&state) ||
      dynamic_cast<const torch::optim::AdamWParamState*>(&state)) {
    return {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
  }
  if (dynamic_cast<const torch::optim::RMSpropParamState*>(&state)) {
    return {"square_avg", "momentum_buffer", "grad_avg"};
  }
  TANDEM_CHECK(false, "fsdp: an optimizer state of a kind require_fsdp_optimizer does not accept");
  return {};
}

std::vector<torch::Tensor> state_tensors(const OptimizerParamState& state) {
  if (const auto* s = dynamic_cast<const torch::optim::SGDParamState*>(&state)) return {s->momentum_buffer()};
  if (const auto* s = dynamic_cast<const torch::optim::AdamParamState*>(&state)) {
    return {s->exp_avg(), s->exp_avg_sq(), s->max_exp_avg_sq()};
  }
  if (const auto* s = dynamic_cast<const torch::optim::AdamWParamState*>(&state)) {
    return {s->exp_avg(), s->exp_avg_sq(), s->max_exp_avg_sq()};
  }
  if (const auto* s = dynamic_cast<const torch::optim::RMSpropParamState*>(&state)) {
    return {s->square_avg(), s->momentum_buffer(), s->grad_avg()};
  }
  TANDEM_CHECK(false, "fsdp: an optimizer state of a kind require_fsdp_optimizer does not accept");
  return {};
}

std::unique_ptr<OptimizerParamState> with_state_tensors(const OptimizerParamState& like,
                                                        const std::vector<torch::Tensor>& t) {
  std::unique_ptr<OptimizerParamState> copy = like.clone();
  if (auto* s = dynamic_cast<torch::optim::SGDParamState*>(copy.get())) {
    s->momentum_buffer(t[0]);
  } else if (auto* s = dynamic_cast<torch::optim::AdamParamState*>(copy.get())) {
    s->exp_avg(t[0]).exp_avg_sq(t[1]).max_exp_avg_sq(t[2]);
  } else if (auto* s = dynamic_cast<torch::optim::AdamWParamState*>(copy.get())) {
    s->exp_avg(t[0]).exp_avg_sq(t[1]).max_exp_avg_sq(t[2]);
  } else if (auto* s = dynamic_cast<torch::optim::RMSpropParamState*>(copy.get())) {
    s->square_avg(t[0]).momentum_buffer(t[1]).grad_avg(t[2]);
  }
  return copy;
}

}  // namespace tandem::optim
