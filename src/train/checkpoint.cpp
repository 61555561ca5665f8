#include "tandem/train/checkpoint.h"

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <string_view>
#include <tuple>
#include <type_traits>

#include "tandem/train/safetensors.h"
#include "tandem/util/error.h"

namespace tandem::train {
namespace {

constexpr const char* kModelPrefix = "model.";
constexpr const char* kMomentumPrefix = "optimizer.momentum.";

// The optimizer's per-parameter state is keyed by the parameter's TensorImpl: as a string of the pointer in
// LibTorch 1.x, as the pointer itself in 2.x. Deducing the key type keeps both builds on one code path.
template <typename StateMap>
typename StateMap::key_type state_key(const torch::Tensor& parameter) {
  using Key = typename StateMap::key_type;
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream out;
    out << static_cast<const void*>(parameter.unsafeGetTensorImpl());
    return out.str();
  } else {
    return static_cast<Key>(parameter.unsafeGetTensorImpl());
  }
}

std::string get_meta(const TensorFile& file, const std::string& key, const std::string& path) {
  auto it = file.metadata.find(key);
  if (it == file.metadata.end()) throw InvalidArgument(path + ": checkpoint metadata lacks '" + key + "'");
  return it->second;
}

std::string format_double(double value) {
  char text[64];
  std::snprintf(text, sizeof text, "%.17g", value);
  return text;
}

// Orders names as text, except that runs of digits compare as the numbers they spell, so that the run
// 20240501-120000-10 comes after 20240501-120000-9 (and after 20240501-120000). Leading zeros are skipped and
// digits compared as text, so numbers of any length compare without overflowing.
bool numbers_aware_less(const std::string& a, const std::string& b) {
  const auto is_digit = [](char c) { return c >= '0' && c <= '9'; };
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (!is_digit(a[i]) || !is_digit(b[j])) {
      if (a[i] != b[j]) return a[i] < b[j];
      ++i, ++j;
      continue;
    }
    size_t a_end = i, b_end = j;
    while (a_end < a.size() && is_digit(a[a_end])) ++a_end;
    while (b_end < b.size() && is_digit(b[b_end])) ++b_end;
    while (i + 1 < a_end && a[i] == '0') ++i;
    while (j + 1 < b_end && b[j] == '0') ++j;
    const std::string_view a_number(a.data() + i, a_end - i), b_number(b.data() + j, b_end - j);
    if (a_number.size() != b_number.size()) return a_number.size() < b_number.size();
    if (a_number != b_number) return a_number < b_number;
    i = a_end, j = b_end;
  }
  return a.size() - i < b.size() - j;
}

}  // namespace

void save_checkpoint(const std::string& path, const torch::nn::Module& module, const torch::optim::SGD& optimizer,
                     const CheckpointState& state) {
  std::vector<std::pair<std::string, torch::Tensor>> tensors;
  for (auto& [name, tensor] : named_state(module)) tensors.emplace_back(kModelPrefix + name, tensor);
  const auto& optimizer_states = optimizer.state();
  using StateMap = std::decay_t<decltype(optimizer_states)>;
  for (const auto& item : module.named_parameters()) {
    auto it = optimizer_states.find(state_key<StateMap>(item.value()));
    if (it == optimizer_states.end()) continue;  // frozen, or no step taken yet
    const auto& sgd_state = static_cast<const torch::optim::SGDParamState&>(*it->second);
    if (sgd_state.momentum_buffer().defined()) {
      tensors.emplace_back(kMomentumPrefix + item.key(), sgd_state.momentum_buffer());
    }
  }
  std::map<std::string, std::string> meta{
      {"format", kCheckpointFormat},
      {"epoch", std::to_string(state.epoch)},
      {"batches_done", std::to_string(state.batches_done)},
      {"step", std::to_string(state.step)},
      {"lr", format_double(state.lr)},
      {"base_lr", format_double(state.base_lr)},
      {"lrf", format_double(state.lrf)},
      {"epochs", std::to_string(state.epochs)},
      {"sampler_seed", std::to_string(state.sampler_seed)},
      {"world_size", std::to_string(state.world_size)},
  };
  if (state.batches_done > 0) {
    meta["epoch_loss_sum"] = format_double(state.epoch_loss_sum);
    meta["epoch_steps"] = std::to_string(state.epoch_steps);
    meta["epoch_train_seconds"] = format_double(state.epoch_train_seconds);
  }
  save_safetensors(path, tensors, meta);
}

CheckpointState load_checkpoint(const std::string& path, torch::nn::Module& module, torch::optim::SGD& optimizer) {
  TensorFile file = load_safetensors(path);
  auto format = file.metadata.find("format");
  if (format == file.metadata.end() || format->second != kCheckpointFormat) {
    throw InvalidArgument(path + ": not a tandem checkpoint (expected metadata format=" + kCheckpointFormat + ")");
  }
  CheckpointState state;
  try {
    state.epoch = std::stoi(get_meta(file, "epoch", path));
    state.batches_done = std::stoll(get_meta(file, "batches_done", path));
    state.step = std::stoll(get_meta(file, "step", path));
    state.lr = std::stod(get_meta(file, "lr", path));
    state.base_lr = std::stod(get_meta(file, "base_lr", path));
    state.lrf = std::stod(get_meta(file, "lrf", path));
    state.epochs = std::stoi(get_meta(file, "epochs", path));
    state.sampler_seed = std::stoull(get_meta(file, "sampler_seed", path));
    state.world_size = std::stoi(get_meta(file, "world_size", path));
    // Mid-epoch checkpoints of older tandems lack the epoch's progress; its metrics line then covers only the
    // batches trained after the resume.
    if (file.metadata.count("epoch_steps")) {
      state.epoch_loss_sum = std::stod(get_meta(file, "epoch_loss_sum", path));
      state.epoch_steps = std::stoll(get_meta(file, "epoch_steps", path));
      state.epoch_train_seconds = std::stod(get_meta(file, "epoch_train_seconds", path));
    }
  } catch (const std::logic_error& error) {  // stoi & co on a damaged value
    throw InvalidArgument(path + ": checkpoint metadata holds a malformed number");
  }

  TensorFile model_part;
  std::map<std::string, torch::Tensor> momentum;
  const std::string model_prefix = kModelPrefix, momentum_prefix = kMomentumPrefix;
  for (auto& [name, tensor] : file.tensors) {
    if (name.rfind(model_prefix, 0) == 0) {
      model_part.tensors.emplace_back(name.substr(model_prefix.size()), tensor);
    } else if (name.rfind(momentum_prefix, 0) == 0) {
      momentum.emplace(name.substr(momentum_prefix.size()), tensor);
    }
  }
  load_weights(module, model_part, path, /*strict=*/true);

  auto& optimizer_states = optimizer.state();
  using StateMap = std::decay_t<decltype(optimizer_states)>;
  torch::NoGradGuard no_grad;
  for (const auto& item : module.named_parameters()) {
    auto it = momentum.find(item.key());
    if (it == momentum.end()) continue;
    if (!it->second.sizes().equals(item.value().sizes())) {
      throw InvalidArgument(path + ": momentum buffer of " + item.key() + " does not fit the model");
    }
    auto sgd_state = std::make_unique<torch::optim::SGDParamState>();
    sgd_state->momentum_buffer(it->second.to(item.value().options()).clone());
    optimizer_states[state_key<StateMap>(item.value())] = std::move(sgd_state);
    momentum.erase(it);
  }
  if (!momentum.empty()) {
    throw InvalidArgument(path + ": momentum buffer for unknown parameter " + momentum.begin()->first);
  }
  for (auto& group : optimizer.param_groups()) group.options().set_lr(state.lr);
  return state;
}

std::string checkpoint_path(const std::string& run_dir, int epoch, int64_t batches_done) {
  char name[64];
  std::snprintf(name, sizeof name, "checkpoint-%04d-%08lld.safetensors", epoch, static_cast<long long>(batches_done));
  return run_dir + "/" + name;
}

std::vector<std::string> list_checkpoints(const std::string& run_dir) {
  DIR* dir = ::opendir(run_dir.c_str());
  if (!dir) return {};
  // Training order is (epoch, batch) read as numbers: the zero padding is only as wide as checkpoint_path makes
  // it, and a name written by hand may have none, so "10" must not sort before "9". The name breaks ties.
  std::vector<std::tuple<int, long long, std::string>> found;
  while (dirent* entry = ::readdir(dir)) {
    std::string name = entry->d_name;
    int epoch = 0;
    long long batches = 0;
    char tail[32] = {0};
    // Exactly checkpoint-EEEE-BBBBBBBB.safetensors; temp files carry a ".tmp.<pid>" suffix and fail the match.
    if (std::sscanf(name.c_str(), "checkpoint-%d-%lld.%31s", &epoch, &batches, tail) == 3 &&
        std::string(tail) == "safetensors") {
      found.emplace_back(epoch, batches, std::move(name));
    }
  }
  ::closedir(dir);
  std::sort(found.begin(), found.end());
  std::vector<std::string> paths;
  for (const auto& entry : found) paths.push_back(run_dir + "/" + std::get<2>(entry));
  return paths;
}

std::optional<std::string> find_latest_checkpoint(const std::string& run_dir) {
  std::vector<std::string> checkpoints = list_checkpoints(run_dir);
  if (checkpoints.empty()) return std::nullopt;
  return checkpoints.back();
}

void remove_unfinished_checkpoints(const std::string& run_dir) {
  DIR* dir = ::opendir(run_dir.c_str());
  if (!dir) return;
  std::vector<std::string> unfinished;
  while (dirent* entry = ::readdir(dir)) {
    const std::string name = entry->d_name;
    if (name.rfind("checkpoint-", 0) == 0 && name.find(".safetensors.tmp.") != std::string::npos) {
      unfinished.push_back(run_dir + "/" + name);
    }
  }
  ::closedir(dir);
  for (const std::string& path : unfinished) ::unlink(path.c_str());
}

void prune_checkpoints(const std::string& run_dir, int keep) {
  if (keep <= 0) return;
  const std::vector<std::string> checkpoints = list_checkpoints(run_dir);
  for (size_t i = 0; i + static_cast<size_t>(keep) < checkpoints.size(); ++i) {
    if (::unlink(checkpoints[i].c_str()) != 0 && errno != ENOENT) {
      throw Error("cannot remove the old checkpoint " + checkpoints[i] + ": " + std::strerror(errno));
    }
  }
}

std::string newest_run_dir(const std::string& runs_dir) {
  std::string best;
  if (DIR* dir = ::opendir(runs_dir.c_str())) {
    while (dirent* entry = ::readdir(dir)) {
      std::string name = entry->d_name;
      if (name == "." || name == "..") continue;
      if ((best.empty() || numbers_aware_less(best, name)) && find_latest_checkpoint(runs_dir + "/" + name)) {
        best = name;
      }
    }
    ::closedir(dir);
  }
  return best.empty() ? "" : runs_dir + "/" + best;
}

}  // namespace tandem::train
