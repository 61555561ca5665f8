#pragma once
// The per-element tensors of the optimizer states that fsdp cuts into shards (SGD, Adam, AdamW, RMSprop), by the
// names PyTorch's state_dict gives them. A shard's per-element state is a slice of its unit's flat state, so these
// are what FullStateView gathers and cuts (fsdp/full_state_view.h) and what a sharded checkpoint stores in pieces.
#include <torch/optim/optimizer.h>

#include <memory>
#include <string>
#include <vector>

namespace tandem::optim {

// Whether `state` is of a kind these functions know (a user's own optimizer's state is opaque to tandem).
bool has_state_fields(const torch::optim::OptimizerParamState& state);
// The field names of `state`'s kind, in state_tensors()'s order: e.g. exp_avg, exp_avg_sq, max_exp_avg_sq.
std::vector<std::string> state_field_names(const torch::optim::OptimizerParamState& state);
// The per-element tensors of one parameter's (or shard's) state; undefined where the optimizer's options keep
// none (AdamW's max_exp_avg_sq without amsgrad).
std::vector<torch::Tensor> state_tensors(const torch::optim::OptimizerParamState& state);
// A copy of `like` (its scalars: Adam's step) holding `tensors` in state_tensors()'s order.
std::unique_ptr<torch::optim::OptimizerParamState> with_state_tensors(const torch::optim::OptimizerParamState& like,
                                                                      const std::vector<torch::Tensor>& tensors);

}  // namespace tandem::optim
