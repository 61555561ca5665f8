#pragma once
// The small train::Loop run that the fsdp loop tests share (tests/train/fsdp_loop_test.cpp,
// fsdp_sharded_loop_test.cpp): an 8-16-2 classifier on separable_set()'s samples, three epochs of batch 8 per
// rank, quiet, into a run dir of the test's own.
#include <torch/nn/modules/container/sequential.h>

#include <cstdint>
#include <string>

#include "tandem/comm/communicator.h"
#include "tandem/train/loop_options.h"

namespace tandem::testing {

// Linear(8, 16), Tanh, Linear(16, 2), its weights drawn from `seed`.
torch::nn::Sequential small_classifier(uint64_t seed);

// Three epochs of batch 8 per rank under `strategy` into `run_dir`; `stop_after` > 0 stops after that many steps
// (a checkpoint inside an epoch).
train::LoopOptions small_loop_options(train::Strategy strategy, const std::string& run_dir, int64_t stop_after = 0);

// A thread rank's communicator, for a Loop that must not own it.
comm::CommunicatorPtr borrowed(comm::Communicator& communicator);

}  // namespace tandem::testing
