#include "tandem/fsdp/unused_parameters.h"

#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "tandem/util/compat.h"

namespace tandem::fsdp {
namespace {

using ElementRanges = std::vector<std::pair<int64_t, int64_t>>;

std::string serialized(const torch::optim::OptimizerParamState& state) {
  torch::serialize::OutputArchive archive;
  state.serialize(archive);
  std::ostringstream bytes;
  archive.save_to(bytes);
  return bytes.str();
}

std::unique_ptr<torch::serialize::InputArchive> archive_of(const std::string& bytes, torch::Device device) {
  auto archive = std::make_unique<torch::serialize::InputArchive>();
  std::istringstream stream(bytes);
  archive->load_from(stream, device);
  return archive;
}

// One shard's unused elements: their values, and the shard's optimizer state as it was, before the step.
struct Kept {
  torch::Tensor shard;
  ElementRanges ranges;
  std::vector<torch::Tensor> values;
  std::optional<std::string> state;  // serialized; none where the optimizer held no state for the shard yet
};

// Puts `kept`'s elements back into the per-element tensors of `state` (those of the shard's size).
void restore_state(torch::optim::OptimizerParamState& state, const Kept& kept) {
  const torch::Device device = kept.shard.device();
  auto now = archive_of(serialized(state), device);
  std::unique_ptr<torch::serialize::InputArchive> before;
  if (kept.state) before = archive_of(*kept.state, device);
  torch::serialize::OutputArchive merged;
  for (const std::string& key : now->keys()) {
    c10::IValue value;
    now->read(key, value);
    if (value.isTensor() && value.toTensor().numel() == kept.shard.numel()) {
      torch::Tensor tensor = value.toTensor();
      c10::IValue old;
      const bool had = before && before->try_read(key, old) && old.isTensor();
      for (const auto& [start, count] : kept.ranges) {
        torch::Tensor elements = tensor.narrow(0, start, count);
        if (had) {
          elements.copy_(old.toTensor().narrow(0, start, count));
        } else {
          elements.zero_();
        }
      }
    }
    merged.write(key, value);
  }
  std::ostringstream bytes;
  merged.save_to(bytes);
  state.serialize(*archive_of(bytes.str(), device));
}

}  // namespace

void step_leaving_unused(ShardedModel& model, torch::optim::Optimizer& optimizer, const std::function<void()>& step) {
  std::vector<Kept> kept;
  {
    torch::NoGradGuard no_grad;
    for (size_t unit = 0; unit < model.units().size(); ++unit) {
      const ElementRanges& ranges = model.unused_elements()[unit];
      if (ranges.empty()) continue;
      Kept entry{model.units()[unit]->shard(), ranges, {}, std::nullopt};
      for (const auto& [start, count] : ranges) entry.values.push_back(entry.shard.narrow(0, start, count).clone());
      auto found = optimizer.state().find(compat::optimizer_state_key(entry.shard));
      if (found != optimizer.state().end()) entry.state = serialized(*found->second);
      kept.push_back(std::move(entry));
    }
  }
  step();
  torch::NoGradGuard no_grad;
  for (const Kept& entry : kept) {
    for (size_t r = 0; r < entry.ranges.size(); ++r) {
      entry.shard.narrow(0, entry.ranges[r].first, entry.ranges[r].second).copy_(entry.values[r]);
    }
    auto found = optimizer.state().find(compat::optimizer_state_key(entry.shard));
    if (found != optimizer.state().end()) restore_state(*found->second, entry);
  }
}

}  // namespace tandem::fsdp
