#include "checkpoint_optimizer.h"

#include <c10/util/Type.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/optim/sgd.h>
#include <torch/version.h>

#include <map>
#include <typeinfo>

#include "checkpoint_fields.h"
#include "tandem/checkpoint/checkpoint.h"
#include "tandem/optim/optimizer_archive.h"
#include "tandem/optim/optimizer_state_fields.h"
#include "tandem/optim/zero_redundancy_optimizer.h"
#include "tandem/util/compat.h"
#include "tandem/util/error.h"
#include "tandem/util/fingerprint.h"
#include "unusable_checkpoint.h"

namespace tandem::checkpoint {
namespace {

constexpr const char* kFirstFormatMomentumPrefix = "optimizer.momentum.";

// LibTorch's optimizer archive names each parameter's state by an address written as text, and reads it back by
// position; 1.x writes the address in hex, 2.x reads it as a decimal number, so an archive does not cross a
// major version (2.x would give every parameter but one no state and crash in the next step).
void check_same_libtorch(const TensorFile& file, const std::string& path) {
  const std::string written_by = optional_meta(file, "libtorch_major", "");
  if (written_by != std::to_string(TORCH_VERSION_MAJOR)) {
    throw InvalidArgument(fmt::format("{} was written by a tandem built with LibTorch {}.x, this one uses {}.x: the "
                                      "optimizer's state does not carry across; continue with a build of the same "
                                      "LibTorch, or start a new run",
                                      path, written_by.empty() ? "?" : written_by, TORCH_VERSION_MAJOR));
  }
}

// LibTorch's archive hands each parameter the state saved at its position without looking at its shape: an archive
// whose fingerprint matches but whose tensors do not fit (written by a tool that is not tandem, or for other
// parameters) would step with tensors of another shape, broadcast or cut. Returns which state does not fit its
// parameter, or "". A user optimizer's state is its own to check.
std::string state_shape_misfit(torch::optim::Optimizer& optimizer) {
  const auto& states = optimizer.state();
  size_t position = 0;
  for (const auto& group : optimizer.param_groups()) {
    for (const torch::Tensor& parameter : group.params()) {
      const auto found = states.find(compat::optimizer_state_key(parameter));
      ++position;
      if (found == states.end() || !optim::has_state_fields(*found->second)) continue;
      for (const torch::Tensor& field : optim::state_tensors(*found->second)) {
        if (field.defined() && !field.sizes().equals(parameter.sizes())) {
          return fmt::format("of parameter {} is a tensor of shape [{}], the parameter's is [{}]", position,
                             fmt::join(field.sizes(), ", "), fmt::join(parameter.sizes(), ", "));
        }
      }
    }
  }
  return "";
}

}  // namespace

std::string archive_fingerprint(const torch::Tensor& archive) {
  return std::to_string(Fingerprint().add(archive.data_ptr(), static_cast<size_t>(archive.numel())).value());
}

void restore_first_format_momentum(const TensorFile& file, const std::string& path, const torch::nn::Module& module,
                                   torch::optim::Optimizer& optimizer, const std::string& kind) {
  if (kind != c10::demangle(typeid(torch::optim::SGD).name())) {
    throw InvalidArgument(fmt::format("{} is a {} checkpoint, which holds SGD state only; this run trains with {}",
                                      path, kFirstCheckpointFormat, kind));
  }
  std::map<std::string, torch::Tensor> momentum;
  const std::string prefix = kFirstFormatMomentumPrefix;
  for (const auto& [name, tensor] : file.tensors) {
    if (name.rfind(prefix, 0) == 0) momentum.emplace(name.substr(prefix.size()), tensor);
  }
  auto& optimizer_states = optimizer.state();
  for (const auto& item : module.named_parameters()) {
    auto it = momentum.find(item.key());
    if (it == momentum.end()) continue;
    if (!it->second.sizes().equals(item.value().sizes())) {
      throw InvalidArgument(path + ": momentum buffer of " + item.key() + " does not fit the model");
    }
    auto sgd_state = std::make_unique<torch::optim::SGDParamState>();
    sgd_state->momentum_buffer(it->second.to(item.value().options()).clone());
    optimizer_states[compat::optimizer_state_key(item.value())] = std::move(sgd_state);
    momentum.erase(it);
  }
  if (!momentum.empty()) {
    throw InvalidArgument(path + ": momentum buffer for unknown parameter " + momentum.begin()->first);
  }
}

void restore_optimizer(const TensorFile& file, const std::string& path, torch::optim::Optimizer& optimizer,
                       const std::string& kind, torch::Device device) {
  const std::string saved_kind = optional_meta(file, "optimizer", "");
  if (saved_kind.empty()) throw_unusable(path + ": checkpoint metadata lacks 'optimizer'", path);
  if (saved_kind != kind) {
    throw InvalidArgument(fmt::format("{} holds the state of a {} optimizer, but this run trains with {}; resume with "
                                      "the optimizer the run started with, or start a new run in another `run_dir`",
                                      path, saved_kind, kind));
  }
  check_same_libtorch(file, path);
  torch::Tensor archive = file.find(kOptimizerArchive);
  // The archive goes to LibTorch's deserializer, which is not built for hostile bytes: a damaged one is
  // refused here, by its fingerprint, with the file named.
  if (!archive.defined() || archive.scalar_type() != torch::kUInt8 || archive.dim() != 1 ||
      optional_meta(file, "optimizer_fingerprint", "") != archive_fingerprint(archive)) {
    throw_unusable(path + ": the optimizer state is missing or damaged", path);
  }
  // 2.x's load also replaces each param group's options with the saved ones, 1.13's keeps them: the options of
  // the run being continued (its flags) win on both.
  std::vector<std::unique_ptr<torch::optim::OptimizerOptions>> current_options;
  for (const auto& group : optimizer.param_groups()) current_options.push_back(group.options().clone());
  try {
    optim::load_optimizer_archive(optimizer, archive, device);
  } catch (const c10::Error& error) {
    throw InvalidArgument(fmt::format("{}: its {} state does not fit this optimizer's parameters ({})", path, kind,
                                      error.what_without_backtrace()));
  }
  auto& groups = optimizer.param_groups();
  for (size_t g = 0; g < groups.size() && g < current_options.size(); ++g) {
    groups[g].set_options(std::move(current_options[g]));
  }
  const std::string misfit = state_shape_misfit(optimizer);
  if (!misfit.empty()) throw_unusable(fmt::format("{}: the optimizer state {} (the file is damaged)", path, misfit), path);
}

std::string optimizer_kind(const torch::optim::Optimizer& optimizer) { return c10::demangle(typeid(optimizer).name()); }

// A sharded optimizer saves its consolidated state as a plain one of its local kind would, so a checkpoint
// resumes with or without sharding.
std::string optimizer_kind(const optim::ZeroRedundancyOptimizer& optimizer) {
  return optimizer_kind(optimizer.local_optimizer());
}

}  // namespace tandem::checkpoint
