#pragma once
// The random generators' states of every rank, so that a resumed run draws the same random numbers (dropout
// masks, a user's own sampling) as the uninterrupted one. A rank draws from the CPU generator and from the
// generator of each accelerator it runs on: one GPU for a DDP rank, one per replica's GPU for DataParallel, whose
// replicas draw their dropout masks on their own devices. The checkpoint stores the states of all ranks
// (checkpoint/checkpoint.h). The data order needs none of this: it is a pure function of (seed, epoch) in the sampler.
#include <torch/types.h>

#include <vector>

#include "tandem/comm/communicator.h"

namespace tandem::checkpoint {

struct RngStates {
  torch::Tensor cpu;  // [world, bytes] of the CPU generator
  // [world, devices, bytes]: the generator of each of generator_devices(...), in that order; undefined for a CPU
  // run. A checkpoint written before DataParallel's devices were covered holds [world, bytes], one device.
  torch::Tensor device;
};

// The accelerators whose generators a rank on `devices` draws from: each once, in the order given, without the
// CPU (its generator is RngStates::cpu). {cpu, cpu} gives none; {cuda:0, cuda:1, cuda:0} gives cuda:0, cuda:1.
std::vector<torch::Device> generator_devices(const std::vector<torch::Device>& devices);

// The default generators' states of `devices`, one uint8 row each ([devices, bytes]), and back. The devices are
// taken as given (a repeat is captured twice), and each must exist here. restore_generators throws
// InvalidArgument, one line, when `states` holds another number of devices or a row of another size, before it
// sets any generator.
torch::Tensor capture_generators(const std::vector<torch::Device>& devices);
void restore_generators(const torch::Tensor& states, const std::vector<torch::Device>& devices);

// Every rank's generator states, on every rank (collective; `communicator` null: a world of one). `devices`: the
// devices this rank runs on, e.g. LoopOptions::device, or DataParallel's replica devices.
RngStates gather_rng_states(comm::Communicator* communicator, const std::vector<torch::Device>& devices);
// One device: a DDP rank's.
RngStates gather_rng_states(comm::Communicator* communicator, torch::Device device);

// Sets this rank's generators from its rows. Throws InvalidArgument if the rows do not match the world size, the
// number of generator devices or a generator (a checkpoint from a CPU run resumed on a GPU keeps the GPU
// generators' seeded states).
void restore_rng_states(const RngStates& states, int rank, int world_size, const std::vector<torch::Device>& devices);
void restore_rng_states(const RngStates& states, int rank, int world_size, torch::Device device);

// The same for a run continued on a world size of its own (train/loop.h): rank r takes row r where the states
// hold one, so the ranks a checkpoint's world shares with this one draw on as if the run had not stopped (on the
// same world size, every rank does, bit for bit). A rank beyond the rows (a larger world) seeds its generators
// with new_rank_seed(seed, rank): a stream of its own, the same in every run with that seed. Rows of ranks beyond
// this world are dropped. Throws InvalidArgument as restore_rng_states does for rows of another shape.
void continue_rng_states(const RngStates& states, int rank, uint64_t seed, const std::vector<torch::Device>& devices);
// splitmix64 of seed and rank: distinct ranks get unrelated streams, and none repeats the run's own seed.
uint64_t new_rank_seed(uint64_t seed, int rank);

}  // namespace tandem::checkpoint
