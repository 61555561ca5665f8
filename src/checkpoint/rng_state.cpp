#include "tandem/checkpoint/rng_state.h"

#include <ATen/Context.h>
#include <fmt/format.h>
#include <torch/cuda.h>

#include <algorithm>
#include <mutex>

#include "tandem/comm/value_collectives.h"
#include "tandem/util/error.h"

namespace tandem::checkpoint {
namespace {

torch::Tensor rows_of_all_ranks(comm::Communicator* communicator, const torch::Tensor& own) {
  if (!communicator || communicator->world_size() < 2) return own.unsqueeze(0);
  return torch::stack(comm::all_gather_values(*communicator, own));
}

// The device's default generator, after checking that the device exists here: ATen's lookup of a GPU this
// process cannot see fails deep inside with a message about its internals.
at::Generator default_generator(torch::Device device) {
  if (device.is_cuda()) {
    const int64_t visible = static_cast<int64_t>(torch::cuda::device_count());
    if (visible == 0 || device.index() >= visible) {
      throw InvalidArgument(fmt::format("random generator of {}: {} GPUs are visible here", device.str(), visible));
    }
  }
  return at::globalContext().defaultGenerator(device);
}

torch::Tensor generator_state(torch::Device device) {
  at::Generator generator = default_generator(device);
  std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.get_state();
}

int64_t generator_state_bytes(torch::Device device) { return generator_state(device).numel(); }

void set_generator_state(torch::Device device, const torch::Tensor& row) {
  at::Generator generator = default_generator(device);
  std::lock_guard<std::mutex> lock(generator.mutex());
  // A copy of its own: the row is a view into all ranks' rows, and LibTorch 2.x's set_state reads the state
  // from the start of the tensor's storage, not from the view's offset (rank 1's row crashed it).
  generator.set_state(row.clone());
}

void check_rank_rows(const torch::Tensor& rows, int64_t dims, int world_size, const char* which) {
  if (rows.dim() != dims || rows.size(0) != world_size || rows.scalar_type() != torch::kUInt8) {
    throw InvalidArgument(fmt::format("the checkpoint's {} generator states are not one uint8 row per rank of {}",
                                      which, world_size));
  }
}

}  // namespace

std::vector<torch::Device> generator_devices(const std::vector<torch::Device>& devices) {
  std::vector<torch::Device> distinct;
  for (const torch::Device& device : devices) {
    if (!device.is_cpu() && std::find(distinct.begin(), distinct.end(), device) == distinct.end()) {
      distinct.push_back(device);
    }
  }
  return distinct;
}

torch::Tensor capture_generators(const std::vector<torch::Device>& devices) {
  std::vector<torch::Tensor> rows;
  for (const torch::Device& device : devices) rows.push_back(generator_state(device));
  if (rows.empty()) return torch::empty({0, 0}, torch::kUInt8);
  return torch::stack(rows);
}

void restore_generators(const torch::Tensor& states, const std::vector<torch::Device>& devices) {
  if (states.dim() != 2 || states.scalar_type() != torch::kUInt8) {
    throw InvalidArgument("the checkpoint's generator states are not one uint8 row per device");
  }
  if (states.size(0) != static_cast<int64_t>(devices.size())) {
    throw InvalidArgument(fmt::format("the checkpoint holds the random generators of {} device{}, but this run "
                                      "draws from {}; resume on as many devices (`dp_devices`) as the run had",
                                      states.size(0), states.size(0) == 1 ? "" : "s", devices.size()));
  }
  for (size_t d = 0; d < devices.size(); ++d) {
    const int64_t bytes = generator_state_bytes(devices[d]);
    if (states.size(1) != bytes) {
      throw InvalidArgument(fmt::format("the checkpoint's generator state for {} has {} bytes; this generator has {}",
                                        devices[d].str(), states.size(1), bytes));
    }
  }
  for (size_t d = 0; d < devices.size(); ++d) set_generator_state(devices[d], states[d]);
}

RngStates gather_rng_states(comm::Communicator* communicator, const std::vector<torch::Device>& devices) {
  RngStates states;
  states.cpu = rows_of_all_ranks(communicator, generator_state(torch::kCPU));
  const std::vector<torch::Device> accelerators = generator_devices(devices);
  if (!accelerators.empty()) states.device = rows_of_all_ranks(communicator, capture_generators(accelerators));
  return states;
}

RngStates gather_rng_states(comm::Communicator* communicator, torch::Device device) {
  return gather_rng_states(communicator, std::vector<torch::Device>{device});
}

void restore_rng_states(const RngStates& states, int rank, int world_size, const std::vector<torch::Device>& devices) {
  if (states.cpu.defined()) {
    check_rank_rows(states.cpu, 2, world_size, "CPU");
    restore_generators(states.cpu[rank].unsqueeze(0), {torch::kCPU});
  }
  const std::vector<torch::Device> accelerators = generator_devices(devices);
  if (states.device.defined() && !accelerators.empty()) {
    // [world, bytes]: a checkpoint from before the devices were listed, of one device.
    const torch::Tensor rows = states.device.dim() == 2 ? states.device.unsqueeze(1) : states.device;
    check_rank_rows(rows, 3, world_size, "device");
    restore_generators(rows[rank], accelerators);
  }
}

void restore_rng_states(const RngStates& states, int rank, int world_size, torch::Device device) {
  restore_rng_states(states, rank, world_size, std::vector<torch::Device>{device});
}

uint64_t new_rank_seed(uint64_t seed, int rank) {
  uint64_t z = seed + 0x9e3779b97f4a7c15ULL * (static_cast<uint64_t>(rank) + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

void continue_rng_states(const RngStates& states, int rank, uint64_t seed, const std::vector<torch::Device>& devices) {
  const int64_t rows = states.cpu.defined() ? states.cpu.size(0) : 0;
  if (rank < rows) {
    restore_rng_states(states, rank, static_cast<int>(rows), devices);
    return;
  }
  if (!states.cpu.defined()) return;  // a checkpoint without generators: every rank keeps its own, as before
  const uint64_t own_seed = new_rank_seed(seed, rank);
  std::vector<torch::Device> seeded = generator_devices(devices);
  seeded.insert(seeded.begin(), torch::kCPU);
  for (const torch::Device& device : seeded) {
    at::Generator generator = default_generator(device);
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_current_seed(own_seed);
  }
}

}  // namespace tandem::checkpoint
