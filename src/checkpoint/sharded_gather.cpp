#include "sharded_gather.h"

#include <string>
#include <vector>

#include "tandem/optim/optimizer_state_fields.h"
#include "tandem/util/compat.h"

namespace tandem::checkpoint {

void add_gathered_parameters(ShardedCheckpointReader& pieces, TensorFile& model_part) {
  for (const ShardedTensor& tensor : pieces.index().tensors) {
    if (!is_optimizer_state_name(tensor.name) && !model_part.find(tensor.name).defined()) {
      model_part.tensors.emplace_back(tensor.name, pieces.read_whole(tensor.name));
    }
  }
}

void fill_parameter_states(ShardedCheckpointReader& pieces, const torch::nn::Module& module,
                           torch::optim::Optimizer& optimizer) {
  auto& states = optimizer.state();
  for (const auto& item : module.named_parameters()) {
    auto found = states.find(compat::optimizer_state_key(item.value()));
    if (found == states.end()) continue;
    std::vector<torch::Tensor> fields;
    for (const std::string& field : optim::state_field_names(*found->second)) {
      const std::string name = optimizer_state_name(item.key(), field);
      fields.push_back(pieces.index().find(name) ? pieces.read_whole(name).to(item.value().options())
                                                 : torch::Tensor());
    }
    found->second = optim::with_state_tensors(*found->second, fields);
  }
}

}  // namespace tandem::checkpoint
