#include "checkpoint_fields.h"

#include <cstdio>
#include <stdexcept>
#include <type_traits>
#include <variant>

#include "tandem/util/error.h"

namespace tandem::checkpoint {
namespace {

// One metadata value of a checkpoint: its key, the member that holds it, and the value a checkpoint without it
// stands for (nullptr: the key is required). Numbers are written as decimal text, doubles with %.17g so that
// they read back bit for bit, bools as "1" or "0".
template <typename Owner>
struct Field {
  const char* key;
  std::variant<int Owner::*, int64_t Owner::*, uint64_t Owner::*, double Owner::*, bool Owner::*,
               std::string Owner::*>
      member;
  const char* fallback = nullptr;
};

// Written into every checkpoint; those with a fallback are missing from the checkpoints of older tandems.
const Field<CheckpointState> kStateFields[] = {
    {"epoch", &CheckpointState::epoch},
    {"batches_done", &CheckpointState::batches_done},
    {"sample_position", &CheckpointState::sample_position, "-1"},
    {"step", &CheckpointState::step},
    {"lr", &CheckpointState::lr},
    {"base_lr", &CheckpointState::base_lr},
    {"initial_batch_size", &CheckpointState::initial_batch_size, "0"},
    {"initial_accumulate_batches", &CheckpointState::initial_accumulate_batches, "0"},
    {"accumulate_batches", &CheckpointState::accumulate_batches, "0"},
    {"lrf", &CheckpointState::lrf},
    {"warmup_steps", &CheckpointState::warmup_steps, "0"},
    {"epochs", &CheckpointState::epochs},
    {"sampler_seed", &CheckpointState::sampler_seed},
    {"world_size", &CheckpointState::world_size},
    // Checkpoints of the first format came from tandem train, whose batches are cut the same way throughout a run.
    {"batch_size", &CheckpointState::batch_size, "0"},
    {"shuffle", &CheckpointState::shuffle, "1"},
    {"drop_last", &CheckpointState::drop_last, "1"},
    {"train_samples", &CheckpointState::train_samples, "0"},
    {"train_fingerprint", &CheckpointState::train_fingerprint, "0"},
    {"precision", &CheckpointState::precision, "32"},
    {"model_name", &CheckpointState::model_name, ""},
};

// The unfinished epoch's training so far: written inside an epoch only (batches_done > 0), read where
// epoch_steps is. Mid-epoch checkpoints of older tandems lack it; the epoch's metrics line then covers only the
// batches trained after the resume.
const Field<CheckpointState> kEpochProgressFields[] = {
    {"epoch_loss_sum", &CheckpointState::epoch_loss_sum},
    {"epoch_steps", &CheckpointState::epoch_steps},
    {"epoch_train_seconds", &CheckpointState::epoch_train_seconds},
    {"epoch_samples", &CheckpointState::epoch_samples, "0"},
};
constexpr const char* kEpochProgressMarker = "epoch_steps";

// The loss scaler's state, written and read only where the run has one (16-mixed).
const Field<amp::GradScalerState> kGradScalerFields[] = {
    {"grad_scaler.scale", &amp::GradScalerState::scale},
    {"grad_scaler.growth_factor", &amp::GradScalerState::growth_factor},
    {"grad_scaler.backoff_factor", &amp::GradScalerState::backoff_factor},
    {"grad_scaler.growth_interval", &amp::GradScalerState::growth_interval},
    {"grad_scaler.growth_tracker", &amp::GradScalerState::growth_tracker},
};
constexpr const char* kGradScalerMarker = "grad_scaler.scale";

template <typename Value>
std::string text_of(const Value& value) {
  if constexpr (std::is_same_v<Value, bool>) {
    return value ? "1" : "0";
  } else if constexpr (std::is_same_v<Value, double>) {
    char text[64];
    std::snprintf(text, sizeof text, "%.17g", value);
    return text;
  } else if constexpr (std::is_same_v<Value, std::string>) {
    return value;
  } else {
    return std::to_string(value);
  }
}

// Throws std::logic_error (invalid_argument, out_of_range) on text that is not a number of that type.
template <typename Value>
Value value_of(const std::string& text) {
  if constexpr (std::is_same_v<Value, bool>) {
    return text == "1";
  } else if constexpr (std::is_same_v<Value, double>) {
    return std::stod(text);
  } else if constexpr (std::is_same_v<Value, std::string>) {
    return text;
  } else if constexpr (std::is_same_v<Value, int>) {
    return std::stoi(text);
  } else if constexpr (std::is_same_v<Value, int64_t>) {
    return std::stoll(text);
  } else {
    static_assert(std::is_same_v<Value, uint64_t>, "a checkpoint field of a type without a text form");
    return std::stoull(text);
  }
}

template <typename Owner, size_t N>
void write_fields(const Field<Owner> (&fields)[N], const Owner& owner, std::map<std::string, std::string>& meta) {
  for (const auto& field : fields) {
    std::visit([&](auto member) { meta[field.key] = text_of(owner.*member); }, field.member);
  }
}

template <typename Owner, size_t N>
void read_fields(const Field<Owner> (&fields)[N], const TensorFile& file, const std::string& path, Owner& owner) {
  for (const auto& field : fields) {
    const std::string text =
        field.fallback ? optional_meta(file, field.key, field.fallback) : get_meta(file, field.key, path);
    std::visit(
        [&](auto member) {
          using Value = std::remove_reference_t<decltype(owner.*member)>;
          owner.*member = value_of<Value>(text);
        },
        field.member);
  }
}

}  // namespace

std::string get_meta(const TensorFile& file, const std::string& key, const std::string& path) {
  auto it = file.metadata.find(key);
  if (it == file.metadata.end()) throw InvalidArgument(path + ": checkpoint metadata lacks '" + key + "'");
  return it->second;
}

std::string optional_meta(const TensorFile& file, const std::string& key, const std::string& fallback) {
  auto it = file.metadata.find(key);
  return it == file.metadata.end() ? fallback : it->second;
}

void write_state_fields(const CheckpointState& state, std::map<std::string, std::string>& meta) {
  write_fields(kStateFields, state, meta);
  if (state.batches_done > 0) write_fields(kEpochProgressFields, state, meta);
  if (state.grad_scaler) write_fields(kGradScalerFields, *state.grad_scaler, meta);
}

CheckpointState read_state_fields(const TensorFile& file, const std::string& path) {
  CheckpointState state;
  try {
    read_fields(kStateFields, file, path, state);
    if (file.metadata.count(kEpochProgressMarker)) read_fields(kEpochProgressFields, file, path, state);
    if (file.metadata.count(kGradScalerMarker)) read_fields(kGradScalerFields, file, path, state.grad_scaler.emplace());
  } catch (const std::logic_error& error) {  // stoi & co on a damaged value
    throw InvalidArgument(path + ": checkpoint metadata holds a malformed number");
  }
  return state;
}

}  // namespace tandem::checkpoint
