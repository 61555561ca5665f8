#include "tandem/fsdp/full_state_view.h"

#include <fmt/format.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <set>
#include <type_traits>
#include <typeinfo>
#include <utility>

#include "tandem/optim/optimizer_state_fields.h"
#include "tandem/util/error.h"

namespace tandem::fsdp {
namespace {

using torch::optim::OptimizerParamState;
using optim::state_tensors;
using optim::with_state_tensors;
using OptimizerStates = std::decay_t<decltype(std::declval<torch::optim::Optimizer&>().state())>;

// `shard_piece` of every rank, end to end: the unit's padded flat vector.
torch::Tensor gather_flat(const FlatUnit& unit, const torch::Tensor& shard_piece, comm::Communicator* communicator) {
  if (!communicator || communicator->world_size() == 1) return shard_piece.detach().clone();
  torch::Tensor flat = torch::empty({unit.padded_numel()}, shard_piece.options());
  torch::Tensor input = shard_piece.detach().contiguous();
  communicator->all_gather_into(flat, input)->wait();
  return flat;
}

// This rank's slice of a flat vector made of `pieces` (one per parameter of `unit`, in its order; the padding 0).
torch::Tensor shard_of(const FlatUnit& unit, const std::vector<torch::Tensor>& pieces, comm::Communicator* communicator) {
  const int world = communicator ? communicator->world_size() : 1;
  const int rank = communicator ? communicator->rank() : 0;
  torch::Tensor flat = torch::zeros({unit.padded_numel()}, pieces.front().options());
  for (size_t p = 0; p < pieces.size(); ++p) {
    const FlatUnit::Parameter& parameter = unit.parameters()[p];
    flat.narrow(0, parameter.offset, parameter.numel).copy_(pieces[p].reshape(-1));
  }
  const int64_t shard_numel = unit.padded_numel() / world;
  return flat.narrow(0, rank * shard_numel, shard_numel).clone();
}

// The shard state of `unit` cut from its parameters' entries in `states`; null where they have none (no step
// yet).
std::unique_ptr<OptimizerParamState> shard_state_of(const FlatUnit& unit, const OptimizerStates& states,
                                                    comm::Communicator* communicator) {
  std::vector<std::vector<torch::Tensor>> fields;  // per parameter
  const OptimizerParamState* like = nullptr;
  for (const FlatUnit::Parameter& parameter : unit.parameters()) {
    auto found = states.find(compat::optimizer_state_key(parameter.tensor));
    if (found == states.end()) break;
    like = found->second.get();
    fields.push_back(state_tensors(*found->second));
  }
  if (fields.size() != unit.parameters().size()) return nullptr;
  std::vector<torch::Tensor> pieces(fields.front().size());
  for (size_t f = 0; f < pieces.size(); ++f) {
    if (!fields.front()[f].defined()) continue;
    std::vector<torch::Tensor> per_parameter;
    for (const auto& parameter_fields : fields) per_parameter.push_back(parameter_fields[f]);
    pieces[f] = shard_of(unit, per_parameter, communicator);
  }
  return with_state_tensors(*like, pieces);
}

const char* kSupportedOptimizers = "torch::optim::SGD, Adam, AdamW or RMSprop";

}  // namespace

std::vector<torch::Tensor> unique_parameters(const torch::nn::Module& module) {
  std::vector<torch::Tensor> unique;
  std::set<const void*> seen;
  for (const auto& parameter : module.parameters()) {
    if (seen.insert(parameter.unsafeGetTensorImpl()).second) unique.push_back(parameter);
  }
  return unique;
}

void require_fsdp_optimizer(const torch::optim::Optimizer& optimizer, torch::nn::Module& module) {
  const bool supported = dynamic_cast<const torch::optim::SGD*>(&optimizer) ||
                         dynamic_cast<const torch::optim::Adam*>(&optimizer) ||
                         dynamic_cast<const torch::optim::AdamW*>(&optimizer) ||
                         dynamic_cast<const torch::optim::RMSprop*>(&optimizer);
  if (!supported) {
    throw InvalidArgument(fmt::format("`strategy` fsdp steps {} on its shards (their state is cut into the "
                                      "checkpoints' full state), not {}; use one of those, or `strategy` ddp",
                                      kSupportedOptimizers, c10::demangle(typeid(optimizer).name())));
  }
  std::set<const void*> module_parameters;
  for (const auto& parameter : module.parameters()) module_parameters.insert(parameter.unsafeGetTensorImpl());
  const auto& groups = optimizer.param_groups();
  std::set<const void*> held;
  for (const auto& group : groups) {
    for (const auto& parameter : group.params()) held.insert(parameter.unsafeGetTensorImpl());
  }
  if (groups.size() != 1 || held != module_parameters) {
    throw InvalidArgument(fmt::format("`strategy` fsdp needs an optimizer of one param group holding exactly the "
                                      "model's {} parameters, and this one has {} param group(s) of {} tensors; build "
                                      "it over model->parameters(), or use `strategy` ddp",
                                      module_parameters.size(), groups.size(), held.size()));
  }
}

void shard_optimizer(ShardedModel& model, torch::nn::Module& module, torch::optim::Optimizer& optimizer) {
  parameter_use_watch::Pause pause;
  torch::NoGradGuard no_grad;
  auto& states = optimizer.state();
  std::vector<torch::Tensor>& params = optimizer.param_groups().front().params();
  std::vector<torch::Tensor> shards = model.shards();
  std::vector<std::unique_ptr<OptimizerParamState>> shard_states;
  for (const auto& unit : model.units()) shard_states.push_back(shard_state_of(*unit, states, model.communicator()));
  for (const auto& parameter : module.parameters()) states.erase(compat::optimizer_state_key(parameter));
  for (size_t u = 0; u < shards.size(); ++u) {
    if (shard_states[u]) states[compat::optimizer_state_key(shards[u])] = std::move(shard_states[u]);
  }
  params = shards;
}

FullStateView::FullStateView(ShardedModel& model, torch::nn::Module& module, torch::optim::Optimizer& optimizer)
    : model_(model), optimizer_(optimizer), module_parameters_(unique_parameters(module)) {
  torch::NoGradGuard no_grad;
  // The forward leaves its last unit gathered (an evaluation's until the next forward): every parameter is a
  // placeholder first, so that the sharded model's own reshard has nothing left to undo.
  for (const auto& unit : model_.units()) unit->reshard();
  auto& states = optimizer_.state();
  for (const auto& unit : model_.units()) {
    // The parameters' values, gathered, and what each held while sharded (a placeholder), to go back to.
    const torch::Tensor values = gather_flat(*unit, unit->shard(), model_.communicator());
    std::vector<torch::Tensor> placeholders;
    for (const FlatUnit::Parameter& parameter : unit->parameters()) {
      placeholders.push_back(parameter.tensor.detach());
      parameter.tensor.set_data(values.narrow(0, parameter.offset, parameter.numel).view(parameter.shape).clone());
    }
    placeholders_.push_back(std::move(placeholders));
    auto found = states.find(compat::optimizer_state_key(unit->shard()));
    if (found == states.end()) {
      shard_states_.emplace_back();
      continue;
    }
    std::unique_ptr<OptimizerParamState> shard_state = std::move(found->second);
    states.erase(found);
    std::vector<torch::Tensor> fields = state_tensors(*shard_state);
    for (auto& field : fields) {
      if (field.defined()) field = gather_flat(*unit, field, model_.communicator());
    }
    for (const FlatUnit::Parameter& parameter : unit->parameters()) {
      std::vector<torch::Tensor> pieces;
      for (const auto& field : fields) {
        pieces.push_back(field.defined() ? field.narrow(0, parameter.offset, parameter.numel).view(parameter.shape).clone()
                                         : torch::Tensor());
      }
      states[compat::optimizer_state_key(parameter.tensor)] = with_state_tensors(*shard_state, pieces);
    }
    shard_states_.push_back(std::move(shard_state));
  }
  optimizer_.param_groups().front().params() = module_parameters_;
}

void FullStateView::commit() {
  torch::NoGradGuard no_grad;
  auto& states = optimizer_.state();
  const auto& units = model_.units();
  for (size_t u = 0; u < units.size(); ++u) {
    const FlatUnit& unit = *units[u];
    std::vector<torch::Tensor> values;
    for (const FlatUnit::Parameter& parameter : unit.parameters()) values.push_back(parameter.tensor);
    units[u]->shard().detach().copy_(shard_of(unit, values, model_.communicator()));
    shard_states_[u] = shard_state_of(unit, states, model_.communicator());
  }
}

FullStateView::~FullStateView() {
  if (kept_) return;
  auto& states = optimizer_.state();
  for (const auto& parameter : module_parameters_) states.erase(compat::optimizer_state_key(parameter));
  const auto& units = model_.units();
  std::vector<torch::Tensor> shards;
  for (size_t u = 0; u < units.size(); ++u) {
    shards.push_back(units[u]->shard());
    const auto& parameters = units[u]->parameters();
    for (size_t p = 0; p < parameters.size(); ++p) parameters[p].tensor.set_data(placeholders_[u][p]);
    if (shard_states_[u]) states[compat::optimizer_state_key(units[u]->shard())] = std::move(shard_states_[u]);
  }
  optimizer_.param_groups().front().params() = shards;
}

}  // namespace tandem::fsdp
