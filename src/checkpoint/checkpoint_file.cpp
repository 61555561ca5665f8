#include "checkpoint_file.h"

#include <torch/version.h>

#include "checkpoint_fields.h"
#include "checkpoint_optimizer.h"
#include "file_damage.h"
#include "tandem/util/error.h"
#include "unusable_checkpoint.h"

namespace tandem::checkpoint {
namespace {

constexpr const char* kModelPrefix = "model.";
constexpr const char* kExtraPrefix = "extra.";
// The model's C++ type (Module::name()), so that a resume with another model can name both; missing from the
// checkpoints of older tandems.
constexpr const char* kModelClass = "model_class";
constexpr const char* kCpuRng = "rng.cpu";
constexpr const char* kDeviceRng = "rng.device";

std::map<std::string, std::string> metadata_of(const torch::nn::Module& module, const std::string& optimizer_kind,
                                               const CheckpointContents& contents, const CheckpointState& state,
                                               const ExtraState& extra) {
  std::map<std::string, std::string> meta = contents.metadata;
  meta.insert({
      {"format", contents.format},
      {kModelClass, module.name()},
      {"optimizer", optimizer_kind},
      {"optimizer_fingerprint", archive_fingerprint(contents.optimizer_archive)},
      {"libtorch_major", std::to_string(TORCH_VERSION_MAJOR)},
  });
  write_state_fields(state, meta);
  for (const auto& [key, value] : extra.values) {
    if (key.empty()) throw InvalidArgument("ExtraState: a value has an empty name");
    meta[kExtraPrefix + key] = value;
  }
  return meta;
}

}  // namespace

void write_checkpoint_file(const std::string& path, const torch::nn::Module& module, const std::string& kind,
                           const CheckpointContents& contents, const CheckpointState& state, const ExtraState& extra) {
  NamedTensors tensors;
  const auto add = [&](const std::string& name, const torch::Tensor& tensor) { tensors.emplace_back(name, tensor); };
  for (const auto& [name, tensor] : contents.model) add(kModelPrefix + name, tensor);
  add(kOptimizerArchive, contents.optimizer_archive);
  if (state.rng.cpu.defined()) add(kCpuRng, state.rng.cpu);
  if (state.rng.device.defined()) add(kDeviceRng, state.rng.device);
  for (const auto& [name, tensor] : extra.tensors) {
    if (name.empty()) throw InvalidArgument("ExtraState: a tensor has an empty name");
    add(kExtraPrefix + name, tensor);
  }
  save_checksummed(path, tensors, metadata_of(module, kind, contents, state, extra));
}

// The file at `path`, read whole and checked to be an intact tandem checkpoint.
TensorFile read_checkpoint_file(const std::string& path) {
  TensorFile file;
  try {
    file = load_safetensors(path);
  } catch (const InvalidArgument& unreadable) {
    throw_unusable(unreadable.what(), path);
  }
  const std::string damage = file_damage(file, path, /*parts=*/false);
  if (!damage.empty()) throw_unusable(damage, path);
  return file;
}

CheckpointState read_state(const TensorFile& file, const std::string& path) {
  CheckpointState state;
  try {
    state = read_state_fields(file, path);
  } catch (const InvalidArgument& error) {  // a key missing, a malformed number: a damaged header
    throw_unusable(error.what(), path);
  }
  state.rng.cpu = file.find(kCpuRng);
  state.rng.device = file.find(kDeviceRng);
  return state;
}

void read_extra(const TensorFile& file, ExtraState& extra) {
  const std::string prefix = kExtraPrefix;
  for (const auto& [name, tensor] : file.tensors) {
    if (name.rfind(prefix, 0) == 0) extra.tensors[name.substr(prefix.size())] = tensor;
  }
  for (const auto& [key, value] : file.metadata) {
    if (key.rfind(prefix, 0) == 0) extra.values[key.substr(prefix.size())] = value;
  }
}

TensorFile stored_model_tensors(const TensorFile& file) {
  TensorFile model_part;
  const std::string model_prefix = kModelPrefix;
  for (const auto& [name, tensor] : file.tensors) {
    if (name.rfind(model_prefix, 0) == 0) model_part.tensors.emplace_back(name.substr(model_prefix.size()), tensor);
  }
  return model_part;
}

std::string saved_model_class(const TensorFile& file, const std::string& fallback) {
  return optional_meta(file, kModelClass, fallback);
}

torch::Device device_of(const torch::nn::Module& module) {
  for (const auto& parameter : module.parameters()) return parameter.device();
  return torch::kCPU;
}

}  // namespace tandem::checkpoint
