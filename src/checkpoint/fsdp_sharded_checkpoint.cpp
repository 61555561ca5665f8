#include "tandem/checkpoint/fsdp_sharded_checkpoint.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <memory>
#include <unordered_map>
#include <utility>
#include <vector>

#include "checkpoint_file.h"
#include "checkpoint_optimizer.h"
#include "model_compatibility.h"
#include "shard_file.h"
#include "sharded_checkpoint_reader.h"
#include "tandem/checkpoint/checkpoint_format.h"
#include "tandem/checkpoint/weights.h"
#include "tandem/fsdp/full_state_view.h"
#include "tandem/fsdp/parameter_use_watch.h"
#include "tandem/optim/optimizer_archive.h"
#include "tandem/optim/optimizer_state_fields.h"
#include "tandem/util/compat.h"
#include "tandem/util/error.h"
#include "unusable_checkpoint.h"

namespace tandem::checkpoint {
namespace {

using fsdp::FlatUnit;
using ParamState = torch::optim::OptimizerParamState;

// The part of one parameter that one rank's shard holds: [unit_begin, unit_end) of the unit's flat vector.
struct Overlap {
  const FlatUnit::Parameter* parameter;
  int64_t unit_begin, unit_end;
};

int rank_of(const fsdp::ShardedModel& model) { return model.communicator() ? model.communicator()->rank() : 0; }
int world_of(const fsdp::ShardedModel& model) { return model.communicator() ? model.communicator()->world_size() : 1; }

std::vector<Overlap> overlaps(const FlatUnit& unit, int rank, int world) {
  const int64_t shard_numel = unit.padded_numel() / world;
  const int64_t low = rank * shard_numel, high = low + shard_numel;
  std::vector<Overlap> out;
  for (const FlatUnit::Parameter& parameter : unit.parameters()) {
    const int64_t from = std::max(low, parameter.offset), to = std::min(high, parameter.offset + parameter.numel);
    if (from < to) out.push_back({&parameter, from, to});
  }
  return out;
}

// Every name of each unit parameter in the module's state dict, the unit's own first. A tied tensor (registered in
// two modules) is one parameter of one unit; the checkpoint holds its values and its state under each of its
// names, as PyTorch's state dict does, so that whatever reads it (a DDP run, `init_weights`) finds every name of
// the model.
class TensorNames {
 public:
  explicit TensorNames(const torch::nn::Module& module) {
    for (const auto& item : module.named_parameters()) names_[item.value().unsafeGetTensorImpl()].push_back(item.key());
  }
  std::vector<std::string> of(const FlatUnit::Parameter& parameter) const {
    std::vector<std::string> names = {parameter.name};
    auto found = names_.find(parameter.tensor.unsafeGetTensorImpl());
    if (found == names_.end()) return names;
    for (const std::string& name : found->second) {
      if (name != parameter.name) names.push_back(name);
    }
    return names;
  }

 private:
  std::unordered_map<const c10::TensorImpl*, std::vector<std::string>> names_;
};

const ParamState* shard_state(const FlatUnit& unit, const torch::optim::Optimizer& optimizer) {
  const auto& states = optimizer.state();
  auto found = states.find(compat::optimizer_state_key(unit.shard()));
  return found == states.end() ? nullptr : found->second.get();
}

// The names of the state fields a unit's shard state holds (defined ones only), with the tensors.
std::vector<std::pair<std::string, torch::Tensor>> defined_fields(const ParamState* state) {
  std::vector<std::pair<std::string, torch::Tensor>> fields;
  if (!state) return fields;
  const std::vector<std::string> names = optim::state_field_names(*state);
  const std::vector<torch::Tensor> tensors = optim::state_tensors(*state);
  for (size_t f = 0; f < names.size(); ++f) {
    if (tensors[f].defined()) fields.emplace_back(names[f], tensors[f]);
  }
  return fields;
}

// While it lives, `optimizer` (shard_optimizer's) holds `module`'s parameters, in the module's order, as the
// plain optimizer would: with each unit's scalars (Adam's step) and no per-element tensors when saving, and
// with what an archive gives them when loading. The shards' own states are set aside and come back after.
class ParameterView {
 public:
  ParameterView(const fsdp::ShardedModel& model, torch::nn::Module& module, torch::optim::Optimizer& optimizer)
      : model_(model), optimizer_(optimizer), module_parameters_(fsdp::unique_parameters(module)) {
    auto& states = optimizer_.state();
    shards_ = optimizer_.param_groups().front().params();
    for (const auto& unit : model_.units()) {
      auto found = states.find(compat::optimizer_state_key(unit->shard()));
      if (found == states.end()) {
        shard_states_.emplace_back();
        continue;
      }
      // Out of the map before inserting into it: an insertion may move its entries.
      std::unique_ptr<ParamState> shard_state = std::move(found->second);
      states.erase(found);
      const std::vector<torch::Tensor> none(optim::state_tensors(*shard_state).size());
      for (const FlatUnit::Parameter& parameter : unit->parameters()) {
        states[compat::optimizer_state_key(parameter.tensor)] = optim::with_state_tensors(*shard_state, none);
      }
      shard_states_.push_back(std::move(shard_state));
    }
    optimizer_.param_groups().front().params() = module_parameters_;
  }
  ~ParameterView() {
    auto& states = optimizer_.state();
    for (const auto& parameter : module_parameters_) states.erase(compat::optimizer_state_key(parameter));
    const auto& units = model_.units();
    for (size_t u = 0; u < units.size(); ++u) {
      if (shard_states_[u]) states[compat::optimizer_state_key(units[u]->shard())] = std::move(shard_states_[u]);
    }
    optimizer_.param_groups().front().params() = shards_;
  }
  ParameterView(const ParameterView&) = delete;
  ParameterView& operator=(const ParameterView&) = delete;

  // What the view held for `parameter` (an archive loaded into it), or null.
  std::unique_ptr<ParamState> take(const torch::Tensor& parameter) {
    auto& states = optimizer_.state();
    auto found = states.find(compat::optimizer_state_key(parameter));
    if (found == states.end()) return nullptr;
    std::unique_ptr<ParamState> state = std::move(found->second);
    states.erase(found);
    return state;
  }
  // Drops the states the view made for the parameters, so that only an archive loaded next gives them one.
  void clear_parameter_states() {
    for (const auto& parameter : module_parameters_) optimizer_.state().erase(compat::optimizer_state_key(parameter));
  }
  // Replaces unit `u`'s shard state (null: none) for when the view ends.
  void set_shard_state(size_t u, std::unique_ptr<ParamState> state) { shard_states_[u] = std::move(state); }

 private:
  const fsdp::ShardedModel& model_;
  torch::optim::Optimizer& optimizer_;
  std::vector<torch::Tensor> module_parameters_, shards_;
  std::vector<std::unique_ptr<ParamState>> shard_states_;
};

// Every tensor of the checkpoint with the pieces of every rank: parameters, then their state fields, each under
// every name of its parameter.
ShardedIndex index_of(const std::string& path, const fsdp::ShardedModel& model, const torch::nn::Module& module,
                      const torch::optim::Optimizer& optimizer) {
  const TensorNames names_of(module);
  ShardedIndex index;
  const int world = world_of(model);
  index.world_size = world;
  for (int r = 0; r < world; ++r) index.files.push_back(shard_file_name(path, r, world));
  for (const auto& unit : model.units()) {
    index.units.push_back({unit->name(), unit->numel(), unit->padded_numel()});
    std::vector<std::string> fields = {""};  // "": the parameter itself
    for (const auto& [field, tensor] : defined_fields(shard_state(*unit, optimizer))) fields.push_back(field);
    for (const std::string& field : fields) {
      for (const FlatUnit::Parameter& parameter : unit->parameters()) {
        std::vector<ShardPiece> pieces;
        for (int r = 0; r < world; ++r) {
          for (const Overlap& overlap : overlaps(*unit, r, world)) {
            if (overlap.parameter != &parameter) continue;
            pieces.push_back({index.files[r], overlap.unit_begin - parameter.offset,
                              overlap.unit_end - parameter.offset, overlap.unit_begin, overlap.unit_end});
          }
        }
        for (const std::string& name : names_of.of(parameter)) {
          index.tensors.push_back({field.empty() ? name : optimizer_state_name(name, field), parameter.shape, "F32",
                                   unit->name(), pieces});
        }
      }
    }
  }
  return index;
}

}  // namespace

void write_fsdp_shard_file(const std::string& path, const fsdp::ShardedModel& model, const torch::nn::Module& module,
                           const torch::optim::Optimizer& optimizer) {
  const TensorNames names_of(module);
  const int rank = rank_of(model), world = world_of(model);
  std::vector<std::pair<std::string, torch::Tensor>> pieces;
  for (const auto& unit : model.units()) {
    const int64_t shard_begin = rank * (unit->padded_numel() / world);
    const auto fields = defined_fields(shard_state(*unit, optimizer));
    for (const Overlap& overlap : overlaps(*unit, rank, world)) {
      const auto cut = [&](const torch::Tensor& flat) {
        return flat.detach().narrow(0, overlap.unit_begin - shard_begin, overlap.unit_end - overlap.unit_begin);
      };
      for (const std::string& name : names_of.of(*overlap.parameter)) {
        pieces.emplace_back(name, cut(unit->shard()));
        for (const auto& [field, tensor] : fields) pieces.emplace_back(optimizer_state_name(name, field), cut(tensor));
      }
    }
  }
  write_shard_file(path, rank, world, pieces);
}

void write_fsdp_checkpoint_file(const std::string& path, const fsdp::ShardedModel& model, torch::nn::Module& module,
                                torch::optim::Optimizer& optimizer, const CheckpointState& state,
                                const ExtraState& extra) {
  CheckpointContents contents;
  contents.format = kShardedCheckpointFormat;
  contents.metadata = write_index(path, index_of(path, model, module, optimizer));
  for (const auto& item : module.named_buffers()) contents.model.emplace_back(item.key(), item.value().detach());
  {
    fsdp::parameter_use_watch::Pause pause;
    ParameterView view(model, module, optimizer);
    contents.optimizer_archive = optim::save_optimizer_archive(optimizer);
  }
  write_checkpoint_file(path, module, optimizer_kind(optimizer), contents, state, extra);
}

CheckpointState load_fsdp_sharded_checkpoint(const std::string& path, fsdp::ShardedModel& model,
                                             torch::nn::Module& module, torch::optim::Optimizer& optimizer,
                                             ExtraState* extra) {
  fsdp::parameter_use_watch::Pause pause;
  torch::NoGradGuard no_grad;
  const TensorFile file = read_checkpoint_file(path);
  TANDEM_CHECK(stored_format(file.metadata) == StoredFormat::kSharded, path, " is not a sharded checkpoint");
  CheckpointState state = read_state(file, path);
  ShardedCheckpointReader pieces(path, file.metadata);

  NamedShapes shapes;
  for (const ShardedTensor& tensor : pieces.index().tensors) {
    if (!is_optimizer_state_name(tensor.name)) shapes.emplace_back(tensor.name, tensor.shape);
  }
  const std::string model_prefix = "model.";
  std::map<std::string, torch::Tensor> buffers;
  for (const auto& [name, tensor] : file.tensors) {
    if (name.rfind(model_prefix, 0) != 0) continue;
    buffers.emplace(name.substr(model_prefix.size()), tensor);
    shapes.emplace_back(name.substr(model_prefix.size()), tensor.sizes().vec());
  }
  require_same_model(file, shapes, module, path, state.model_name);
  for (const auto& item : module.named_buffers()) item.value().copy_(buffers.at(item.key()));

  ParameterView view(model, module, optimizer);
  view.clear_parameter_states();
  restore_optimizer(file, path, optimizer, optimizer_kind(optimizer), device_of(module));
  const int rank = rank_of(model), world = world_of(model);
  const auto& units = model.units();
  for (size_t u = 0; u < units.size(); ++u) {
    const FlatUnit& unit = *units[u];
    std::unique_ptr<ParamState> like;
    for (const FlatUnit::Parameter& parameter : unit.parameters()) {
      std::unique_ptr<ParamState> loaded = view.take(parameter.tensor);
      if (!like) like = std::move(loaded);
    }
    const int64_t shard_numel = unit.padded_numel() / world, shard_begin = rank * shard_numel;
    // The shard, then each state field the checkpoint holds for this unit; the padding stays zero.
    std::vector<std::string> names = {""};
    if (like) {
      for (const std::string& field : optim::state_field_names(*like)) names.push_back(field);
    }
    std::vector<torch::Tensor> flats;
    for (const std::string& field : names) {
      const auto name_of = [&](const FlatUnit::Parameter& p) {
        return field.empty() ? p.name : optimizer_state_name(p.name, field);
      };
      if (!pieces.index().find(name_of(unit.parameters().front()))) {
        flats.emplace_back();
        continue;
      }
      torch::Tensor flat = torch::zeros({shard_numel}, unit.shard().options());
      for (const Overlap& overlap : overlaps(unit, rank, world)) {
        const int64_t offset = overlap.parameter->offset;
        flat.narrow(0, overlap.unit_begin - shard_begin, overlap.unit_end - overlap.unit_begin)
            .copy_(pieces.read_range(name_of(*overlap.parameter), overlap.unit_begin - offset, overlap.unit_end - offset));
      }
      flats.push_back(flat);
    }
    if (!flats.front().defined()) {
      throw_unusable(fmt::format("{}: its index has no tensor '{}'", path, unit.parameters().front().name), path);
    }
    units[u]->shard().detach().copy_(flats.front());
    const std::vector<torch::Tensor> fields(flats.begin() + 1, flats.end());
    view.set_shard_state(u, like ? optim::with_state_tensors(*like, fields) : nullptr);
  }
  if (extra) read_extra(file, *extra);
  return state;
}

}  // namespace tandem::checkpoint
