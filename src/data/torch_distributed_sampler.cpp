#include "tandem/data/torch_distributed_sampler.h"

#include <torch/serialize/archive.h>
#include <torch/torch.h>

#include <algorithm>

#include "tandem/util/error.h"

namespace tandem::data {
namespace {

constexpr const char* kEpochKey = "tandem_distributed_sampler_epoch";
constexpr const char* kPositionKey = "tandem_distributed_sampler_position";

int64_t read_int64(torch::serialize::InputArchive& archive, const char* key) {
  torch::Tensor value;
  archive.read(key, value, /*is_buffer=*/true);
  return value.item<int64_t>();
}

}  // namespace

TorchDistributedSampler::TorchDistributedSampler(DistributedSampler sampler)
    : state_(std::make_shared<State>(State{std::move(sampler), {}, 0, 0})) {
  restart();
}

void TorchDistributedSampler::set_epoch(int64_t epoch) {
  if (epoch != state_->sampler.epoch()) state_->loaded_position = 0;
  state_->sampler.set_epoch(epoch);
  restart();
}

void TorchDistributedSampler::restart() {
  state_->order = state_->sampler.indices();
  state_->position = state_->loaded_position;
}

int64_t TorchDistributedSampler::epoch() const { return state_->sampler.epoch(); }

void TorchDistributedSampler::reset(compat::TorchDataOptional<size_t> new_size) {
  State& state = *state_;
  if (new_size.has_value() && static_cast<int64_t>(*new_size) != state.sampler.dataset_size()) {
    DistributedSampler resized(static_cast<int64_t>(*new_size), state.sampler.options());
    resized.set_epoch(state.sampler.epoch());
    state.sampler = std::move(resized);
    state.loaded_position = 0;
  }
  restart();
  // The loader's begin() is the one reset a loaded position must survive; after it, epochs start at 0.
  state.loaded_position = 0;
}

compat::TorchDataOptional<std::vector<size_t>> TorchDistributedSampler::next(size_t batch_size) {
  if (batch_size == 0) throw InvalidArgument("TorchDistributedSampler: batch size must be >= 1, got 0");
  State& state = *state_;
  if (state.position >= state.order.size()) return {};
  const size_t end = std::min(state.order.size(), state.position + batch_size);
  std::vector<size_t> batch(state.order.begin() + static_cast<std::ptrdiff_t>(state.position),
                            state.order.begin() + static_cast<std::ptrdiff_t>(end));
  state.position = end;
  return batch;
}

void TorchDistributedSampler::save(torch::serialize::OutputArchive& archive) const {
  archive.write(kEpochKey, torch::tensor(epoch(), torch::kLong), /*is_buffer=*/true);
  archive.write(kPositionKey, torch::tensor(position(), torch::kLong), /*is_buffer=*/true);
}

void TorchDistributedSampler::load(torch::serialize::InputArchive& archive) {
  const int64_t epoch = read_int64(archive, kEpochKey);
  const int64_t position = read_int64(archive, kPositionKey);
  const int64_t num_samples = state_->sampler.num_samples();
  if (position < 0 || position > num_samples) {
    throw InvalidArgument(detail::concat("TorchDistributedSampler: saved position ", position, " is outside [0, ",
                                         num_samples, "], the length of this rank's order"));
  }
  state_->loaded_position = static_cast<size_t>(position);
  state_->sampler.set_epoch(epoch);
  restart();
}

int64_t TorchDistributedSampler::position() const { return static_cast<int64_t>(state_->position); }

const DistributedSampler& TorchDistributedSampler::sampler() const { return state_->sampler; }

}  // namespace tandem::data
