#pragma once
// The random generators' states of every rank, so that a resumed run draws the same random numbers (dropout
// masks, a user's own sampling) as the uninterrupted one. Each rank's state is one row of a uint8 tensor; the
// checkpoint stores the rows of all ranks (train/checkpoint.h). The data order needs none of this: it is a pure
// function of (seed, epoch) in the sampler.
#include <torch/types.h>

#include "tandem/comm/communicator.h"

namespace tandem::train {

struct RngStates {
  torch::Tensor cpu;     // [world, bytes] of the CPU generator
  torch::Tensor device;  // [world, bytes] of `device`'s generator; undefined for a CPU run
};

// Every rank's generator states, on every rank (collective; `communicator` null: a world of one).
RngStates gather_rng_states(comm::Communicator* communicator, torch::Device device);

// Sets this rank's generators from its rows. Throws InvalidArgument if the rows do not match the world size or
// the generator (a checkpoint from a CPU run resumed on a GPU keeps the GPU generator's seeded state).
void restore_rng_states(const RngStates& states, int rank, int world_size, torch::Device device);

}  // namespace tandem::train
