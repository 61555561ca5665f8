#include "tandem/train/checkpoint.h"

#include <c10/util/Type.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/optim/sgd.h>
#include <torch/version.h>

#include <cstdio>
#include <filesystem>
#include <optional>
#include <set>
#include <string_view>
#include <typeinfo>

#include "checkpoint_fields.h"
#include "checkpoint_file.h"
#include "optimizer_state_fields.h"
#include "sharded_checkpoint.h"
#include "tandem/monitor/crc32c.h"
#include "tandem/optim/optimizer_archive.h"
#include "tandem/optim/zero_redundancy_optimizer.h"
#include "tandem/train/safetensors.h"
#include "tandem/util/compat.h"
#include "tandem/util/error.h"
#include "tandem/util/fingerprint.h"
#include "tandem/util/log.h"

namespace tandem::train {
namespace {

constexpr const char* kFirstFormat = "tandem-checkpoint-1";
constexpr const char* kSecondFormat = "tandem-checkpoint-2";  // the last one without checksums
constexpr const char* kModelPrefix = "model.";
constexpr const char* kExtraPrefix = "extra.";
constexpr const char* kOptimizerArchive = "optimizer.archive";
// The model's C++ type (Module::name()), so that a resume with another model can name both; missing from the
// checkpoints of older tandems.
constexpr const char* kModelClass = "model_class";
constexpr const char* kFirstFormatMomentumPrefix = "optimizer.momentum.";
constexpr const char* kCpuRng = "rng.cpu";
constexpr const char* kDeviceRng = "rng.device";
constexpr const char* kChecksumPrefix = "crc32c.";
constexpr const char* kHeaderChecksum = "crc32c.__header__";

uint64_t fingerprint_of(const torch::Tensor& bytes) {
  return Fingerprint().add(bytes.data_ptr(), static_cast<size_t>(bytes.numel())).value();
}

std::string not_a_checkpoint(const std::string& path) {
  return path + ": not a tandem checkpoint (expected metadata format=" + kCheckpointFormat + ")";
}

std::string checksum_text(uint32_t crc) { return fmt::format("{:08x}", crc); }

uint32_t checksum_of_bytes(const torch::Tensor& cpu_contiguous) {
  return monitor::crc32c(std::string_view(static_cast<const char*>(cpu_contiguous.data_ptr()), cpu_contiguous.nbytes()));
}

// Covers what the entries' own checksums do not: every entry's name, dtype and shape, and every metadata value
// (epoch, step, the schedule...), which a damaged byte could change into another valid number.
uint32_t checksum_of_header(const std::vector<TensorEntry>& entries, const std::map<std::string, std::string>& metadata) {
  std::map<std::string, std::string> layouts;
  for (const TensorEntry& entry : entries) {
    layouts[entry.name] = fmt::format("{} [{}]", c10::toString(entry.dtype), fmt::join(entry.shape, ","));
  }
  std::string text;
  for (const auto& [name, layout] : layouts) text += name + '\0' + layout + '\n';
  text += '\n';
  for (const auto& [key, value] : metadata) {
    if (key != kHeaderChecksum) text += key + '\0' + value + '\n';
  }
  return monitor::crc32c(text);
}

std::vector<TensorEntry> entries_of(const NamedTensors& tensors) {
  std::vector<TensorEntry> entries;
  for (const auto& [name, tensor] : tensors) entries.push_back({name, tensor.scalar_type(), tensor.sizes().vec()});
  return entries;
}

// What is wrong with `file`, read from `path`, as a checkpoint: not one at all, or the header or the first entry
// whose bytes do not match their checksum; "" when it is whole. Formats before checksums are whole if they
// read. With `parts`, a sharded checkpoint's other files are checked too, one entry at a time: the run dir's
// search does that once, on rank 0; a rank that loads it checks the pieces it reads as it reads them, so that no
// rank reads every rank's file.
std::string damage_of(const TensorFile& file, const std::string& path, bool parts = true) {
  const std::string format = optional_meta(file, "format", "");
  if (format == kSecondFormat || format == kFirstFormat) return "";
  if (format != kCheckpointFormat && format != kShardedCheckpointFormat) return not_a_checkpoint(path);
  std::string damage = header_damage(entries_of(file.tensors), file.metadata, path);
  for (const auto& [name, tensor] : file.tensors) {
    if (damage.empty()) damage = entry_damage(name, tensor, file.metadata, path);
  }
  if (parts && damage.empty() && format == kShardedCheckpointFormat) {
    damage = sharded_checkpoint_damage(path, file.metadata);
  }
  return damage;
}

std::map<std::string, std::string> metadata_of(const torch::nn::Module& module, const std::string& optimizer_kind,
                                               const CheckpointContents& contents, const CheckpointState& state,
                                               const ExtraState& extra) {
  const torch::Tensor& archive = contents.optimizer_archive;
  std::map<std::string, std::string> meta = contents.metadata;
  meta.insert({
      {"format", contents.format},
      {kModelClass, module.name()},
      {"optimizer", optimizer_kind},
      {"optimizer_fingerprint", std::to_string(fingerprint_of(archive))},
      {"libtorch_major", std::to_string(TORCH_VERSION_MAJOR)},
  });
  write_state_fields(state, meta);
  for (const auto& [key, value] : extra.values) {
    if (key.empty()) throw InvalidArgument("ExtraState: a value has an empty name");
    meta[kExtraPrefix + key] = value;
  }
  return meta;
}

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
      if (found == states.end() || !has_state_fields(*found->second)) continue;
      for (const torch::Tensor& field : state_tensors(*found->second)) {
        if (field.defined() && !field.sizes().equals(parameter.sizes())) {
          return fmt::format("of parameter {} is a tensor of shape [{}], the parameter's is [{}]", position,
                             fmt::join(field.sizes(), ", "), fmt::join(parameter.sizes(), ", "));
        }
      }
    }
  }
  return "";
}

// tandem-checkpoint-1 held SGD momentum buffers by parameter name, the only optimizer tandem had then.
void restore_first_format_momentum(const TensorFile& file, const std::string& path, const torch::nn::Module& module,
                                   torch::optim::Optimizer& optimizer, const std::string& kind) {
  if (kind != c10::demangle(typeid(torch::optim::SGD).name())) {
    throw InvalidArgument(fmt::format("{} is a {} checkpoint, which holds SGD state only; this run trains with {}",
                                      path, kFirstFormat, kind));
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

// The first difference between the model tensors a checkpoint holds (`saved`, names without "model.") and
// `module`'s, in the module's order: a tensor only one of them has, or one of another shape; "" when none.
std::string first_model_difference(const NamedShapes& saved, const torch::nn::Module& module) {
  std::map<std::string, std::vector<int64_t>> saved_shapes(saved.begin(), saved.end());
  std::set<std::string> in_module;
  for (const auto& [name, tensor] : named_state(module)) {
    in_module.insert(name);
    auto found = saved_shapes.find(name);
    if (found == saved_shapes.end()) return fmt::format("the model's '{}' is not in the checkpoint", name);
    if (!tensor.sizes().equals(found->second)) {
      return fmt::format("'{}' is [{}] in the checkpoint, [{}] in the model", name, fmt::join(found->second, ", "),
                         fmt::join(tensor.sizes(), ", "));
    }
  }
  for (const auto& [name, shape] : saved) {
    if (!in_module.count(name)) return fmt::format("the checkpoint's '{}' is not in the model", name);
  }
  return "";
}

// A sharded checkpoint's per-element optimizer state, gathered from its pieces into the state of each of
// `module`'s parameters that the archive gave a state (its scalars: Adam's step).
void fill_parameter_states(ShardedCheckpointReader& pieces, const torch::nn::Module& module,
                           torch::optim::Optimizer& optimizer) {
  auto& states = optimizer.state();
  for (const auto& item : module.named_parameters()) {
    auto found = states.find(compat::optimizer_state_key(item.value()));
    if (found == states.end()) continue;
    std::vector<torch::Tensor> fields;
    for (const std::string& field : state_field_names(*found->second)) {
      const std::string name = optimizer_state_name(item.key(), field);
      fields.push_back(pieces.index().find(name) ? pieces.read_whole(name).to(item.value().options()) : torch::Tensor());
    }
    found->second = with_state_tensors(*found->second, fields);
  }
}

// The file's model.* entries under the model's names: every tensor of a full checkpoint's model, the buffers of a
// sharded one's.
TensorFile stored_model_tensors(const TensorFile& file) {
  TensorFile model_part;
  const std::string model_prefix = kModelPrefix;
  for (const auto& [name, tensor] : file.tensors) {
    if (name.rfind(model_prefix, 0) == 0) model_part.tensors.emplace_back(name.substr(model_prefix.size()), tensor);
  }
  return model_part;
}

// A sharded checkpoint's parameters, each gathered whole from its pieces, into `model_part`.
void add_gathered_parameters(ShardedCheckpointReader& pieces, TensorFile& model_part) {
  for (const ShardedTensor& tensor : pieces.index().tensors) {
    if (!is_optimizer_state_name(tensor.name) && !model_part.find(tensor.name).defined()) {
      model_part.tensors.emplace_back(tensor.name, pieces.read_whole(tensor.name));
    }
  }
}

// `per_parameter_state`: whether the optimizer keeps each parameter's state where fill_parameter_states can put
// it (not a ZeroRedundancyOptimizer, whose state only its archive fills).
CheckpointState load_checkpoint_of_kind(const std::string& path, torch::nn::Module& module,
                                        torch::optim::Optimizer& optimizer, const std::string& kind,
                                        bool per_parameter_state, ExtraState* extra) {
  const TensorFile file = read_checkpoint_file(path);
  const std::string format = optional_meta(file, "format", "");
  if (format != kCheckpointFormat && format != kShardedCheckpointFormat) {
    log::main_info("{} is a {} checkpoint, written before checkpoints carried checksums: it is loaded unverified",
                   path, format);
  }
  CheckpointState state = read_state(file, path);

  TensorFile model_part = stored_model_tensors(file);
  NamedShapes shapes;
  // A sharded checkpoint's parameters are gathered whole from its pieces: this rank holds the whole model anyway.
  std::optional<ShardedCheckpointReader> pieces;
  if (format == kShardedCheckpointFormat) {
    if (!per_parameter_state) {
      throw InvalidArgument(fmt::format("{} is a sharded checkpoint of `strategy` fsdp, which a sharded optimizer "
                                        "cannot take its state from; continue it with `strategy` fsdp, or with a "
                                        "plain optimizer",
                                        path));
    }
    pieces.emplace(path, file.metadata);
    for (const ShardedTensor& tensor : pieces->index().tensors) {
      if (!is_optimizer_state_name(tensor.name)) shapes.emplace_back(tensor.name, tensor.shape);
    }
  }
  for (const auto& [name, tensor] : model_part.tensors) shapes.emplace_back(name, tensor.sizes().vec());
  require_same_model(file, shapes, module, path, state.model_name);
  if (pieces) add_gathered_parameters(*pieces, model_part);
  load_weights(module, model_part, path, /*strict=*/true);
  if (format == kFirstFormat) {
    restore_first_format_momentum(file, path, module, optimizer, kind);
  } else {
    restore_optimizer(file, path, optimizer, kind, device_of(module));
  }
  if (pieces) fill_parameter_states(*pieces, module, optimizer);
  if (extra) read_extra(file, *extra);
  return state;
}

}  // namespace

void save_checksummed(const std::string& path, const NamedTensors& tensors, std::map<std::string, std::string> metadata) {
  // On the CPU and contiguous as the file holds them, so that the checksums are of the bytes written.
  NamedTensors host;
  for (const auto& [name, tensor] : tensors) host.emplace_back(name, tensor.detach().to(torch::kCPU).contiguous());
  for (const auto& [name, tensor] : host) metadata[kChecksumPrefix + name] = checksum_text(checksum_of_bytes(tensor));
  metadata[kHeaderChecksum] = checksum_text(checksum_of_header(entries_of(host), metadata));
  save_safetensors(path, host, metadata);
}

std::string header_damage(const std::vector<TensorEntry>& entries, const std::map<std::string, std::string>& metadata,
                          const std::string& path) {
  auto found = metadata.find(kHeaderChecksum);
  if (found != metadata.end() && found->second == checksum_text(checksum_of_header(entries, metadata))) return "";
  return fmt::format("{}: its metadata (or an entry's name, dtype or shape) does not match its checksum (the file is "
                     "damaged)",
                     path);
}

std::string entry_damage(const std::string& name, const torch::Tensor& bytes,
                         const std::map<std::string, std::string>& metadata, const std::string& path) {
  auto found = metadata.find(kChecksumPrefix + name);
  if (found != metadata.end() && found->second == checksum_text(checksum_of_bytes(bytes.contiguous()))) return "";
  return fmt::format("{}: entry '{}' does not match its checksum (the file is damaged)", path, name);
}

// `what` is wrong with the checkpoint at `path` itself (damaged, cut short, not one at all): the run dir's
// checkpoint before it may well be whole, and the loop continues from that one once this one is out of the way.
[[noreturn]] void throw_unusable(const std::string& what, const std::string& path) {
  throw InvalidArgument(fmt::format("{}; move {} out of the run dir to continue from the checkpoint before it, or "
                                    "start a new run in another `run_dir`",
                                    what, std::filesystem::path(path).filename().string()));
}

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
  const std::string damage = damage_of(file, path, /*parts=*/false);
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

torch::Device device_of(const torch::nn::Module& module) {
  for (const auto& parameter : module.parameters()) return parameter.device();
  return torch::kCPU;
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
      optional_meta(file, "optimizer_fingerprint", "") != std::to_string(fingerprint_of(archive))) {
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

void read_extra(const TensorFile& file, ExtraState& extra) {
  const std::string prefix = kExtraPrefix;
  for (const auto& [name, tensor] : file.tensors) {
    if (name.rfind(prefix, 0) == 0) extra.tensors[name.substr(prefix.size())] = tensor;
  }
  for (const auto& [key, value] : file.metadata) {
    if (key.rfind(prefix, 0) == 0) extra.values[key.substr(prefix.size())] = value;
  }
}

// Compared before anything is copied: a run dir continued with another model (or another number of classes)
// is one line naming both models and the first tensor that differs, where load_weights would list every one.
void require_same_model(const TensorFile& file, const NamedShapes& saved, const torch::nn::Module& module,
                        const std::string& path, const std::string& saved_model_name) {
  const std::string difference = first_model_difference(saved, module);
  if (difference.empty()) return;
  const std::string trained_as =
      saved_model_name.empty() ? "" : fmt::format(" (the run was trained with `model` {})", saved_model_name);
  const std::string saved_class = optional_meta(file, kModelClass, "model");
  const size_t module_tensors = named_state(module).size();
  const std::string models =
      saved_class == module.name() && saved.size() == module_tensors
          ? ""
          : fmt::format("the checkpoint holds a {} of {} tensors, this run's model is a {} of {}, and ", saved_class,
                        saved.size(), module.name(), module_tensors);
  throw InvalidArgument(fmt::format("{} was written for another model{}: {}{}; resume with the `model` and "
                                    "`num_classes` the run was trained with, or start a new run in another `run_dir`",
                                    path, trained_as, models, difference));
}

std::string optimizer_kind(const torch::optim::Optimizer& optimizer) { return c10::demangle(typeid(optimizer).name()); }

// A sharded optimizer saves its consolidated state as a plain one of its local kind would, so a checkpoint
// resumes with or without sharding.
std::string optimizer_kind(const optim::ZeroRedundancyOptimizer& optimizer) {
  return optimizer_kind(optimizer.local_optimizer());
}

void save_checkpoint(const std::string& path, const torch::nn::Module& module, const torch::optim::Optimizer& optimizer,
                     const CheckpointState& state, const ExtraState& extra) {
  write_checkpoint_file(path, module, optimizer_kind(optimizer),
                        {named_state(module), optim::save_optimizer_archive(optimizer), kCheckpointFormat, {}}, state,
                        extra);
}

void save_checkpoint(const std::string& path, const torch::nn::Module& module,
                     const optim::ZeroRedundancyOptimizer& optimizer, const CheckpointState& state,
                     const ExtraState& extra) {
  write_checkpoint_file(path, module, optimizer_kind(optimizer),
                        {named_state(module), optim::save_optimizer_archive(optimizer), kCheckpointFormat, {}}, state,
                        extra);
}

CheckpointState load_checkpoint(const std::string& path, torch::nn::Module& module, torch::optim::Optimizer& optimizer,
                                ExtraState* extra) {
  return load_checkpoint_of_kind(path, module, optimizer, optimizer_kind(optimizer), true, extra);
}

CheckpointState load_checkpoint(const std::string& path, torch::nn::Module& module,
                                optim::ZeroRedundancyOptimizer& optimizer, ExtraState* extra) {
  return load_checkpoint_of_kind(path, module, optimizer, optimizer_kind(optimizer), false, extra);
}

TensorFile read_model_weights(const std::string& path) {
  TensorFile file = load_safetensors(path);
  const std::string format = optional_meta(file, "format", "");
  if (format != kCheckpointFormat && format != kShardedCheckpointFormat && format != kSecondFormat &&
      format != kFirstFormat) {
    return file;
  }
  const std::string damage = damage_of(file, path);
  if (!damage.empty()) throw InvalidArgument(damage + "; start from an intact checkpoint or weights file");
  TensorFile weights = stored_model_tensors(file);
  if (format == kShardedCheckpointFormat) {
    ShardedCheckpointReader pieces(path, file.metadata);
    add_gathered_parameters(pieces, weights);
  }
  return weights;
}

std::string checkpoint_damage(const std::string& path) {
  try {
    return damage_of(load_safetensors(path), path);
  } catch (const InvalidArgument& unreadable) {  // truncated, or not safetensors at all
    return unreadable.what();
  }
}

}  // namespace tandem::train
