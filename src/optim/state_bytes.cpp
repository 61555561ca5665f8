#include "tandem/optim/state_bytes.h"

#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <sstream>
#include <string>

namespace tandem::optim {
namespace {

// A param state class lists its fields only to serialize(); a round trip through an archive lets us read them
// back by name without knowing the class.
int64_t tensor_bytes(const torch::optim::OptimizerParamState& state) {
  torch::serialize::OutputArchive out;
  state.serialize(out);
  std::stringstream bytes;
  out.save_to(bytes);
  torch::serialize::InputArchive in;
  in.load_from(bytes);
  int64_t total = 0;
  for (const std::string& key : in.keys()) {
    torch::Tensor tensor;
    if (in.try_read(key, tensor)) total += tensor.numel() * tensor.element_size();
  }
  return total;
}

}  // namespace

int64_t optimizer_state_bytes(const torch::optim::Optimizer& optimizer) {
  int64_t total = 0;
  for (const auto& [key, state] : optimizer.state()) total += tensor_bytes(*state);
  return total;
}

}  // namespace tandem::optim
