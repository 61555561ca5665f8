#include "tandem/train/rng_state.h"

#include <ATen/Context.h>
#include <fmt/format.h>

#include <mutex>

#include "tandem/comm/value_collectives.h"
#include "tandem/util/error.h"

namespace tandem::train {
namespace {

torch::Tensor rows_of_all_ranks(comm::Communicator* communicator, const torch::Tensor& own) {
  if (!communicator || communicator->world_size() < 2) return own.unsqueeze(0);
  return torch::stack(comm::all_gather_values(*communicator, own));
}

torch::Tensor generator_state(torch::Device device) {
  at::Generator generator = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.get_state();
}

void set_generator_state(torch::Device device, const torch::Tensor& row, const char* which) {
  at::Generator generator = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(generator.mutex());
  if (row.numel() != generator.get_state().numel()) {
    throw InvalidArgument(fmt::format("the checkpoint's {} generator state has {} bytes; this generator has {}",
                                      which, row.numel(), generator.get_state().numel()));
  }
  // A copy of its own: the row is a view into all ranks' rows, and LibTorch 2.x's set_state reads the state
  // from the start of the tensor's storage, not from the view's offset (rank 1's row crashed it).
  generator.set_state(row.clone());
}

}  // namespace

RngStates gather_rng_states(comm::Communicator* communicator, torch::Device device) {
  RngStates states;
  states.cpu = rows_of_all_ranks(communicator, generator_state(torch::kCPU));
  if (!device.is_cpu()) states.device = rows_of_all_ranks(communicator, generator_state(device));
  return states;
}

void restore_rng_states(const RngStates& states, int rank, int world_size, torch::Device device) {
  const auto check_rows = [&](const torch::Tensor& rows, const char* which) {
    if (rows.dim() != 2 || rows.size(0) != world_size || rows.scalar_type() != torch::kUInt8) {
      throw InvalidArgument(fmt::format("the checkpoint's {} generator states are not one uint8 row per rank of {}",
                                        which, world_size));
    }
  };
  if (states.cpu.defined()) {
    check_rows(states.cpu, "CPU");
    set_generator_state(torch::kCPU, states.cpu[rank], "CPU");
  }
  if (states.device.defined() && !device.is_cpu()) {
    check_rows(states.device, "device");
    set_generator_state(device, states.device[rank], "device");
  }
}

}  // namespace tandem::train
