// Restoring a rank's random generator from its row of all ranks' states: rank 1's row lies at an offset inside
// the tensor (inside the checkpoint file's buffer once loaded), and LibTorch 2.x reads a state from the start of
// its storage, so the row must reach the generator on its own.
#include <gtest/gtest.h>

#include "tandem/train/rng_state.h"
#include "tandem/util/error.h"

namespace tandem::train {
namespace {

TEST(RngState, EachRankGetsItsOwnRowBackExactly) {
  torch::manual_seed(11);
  const torch::Tensor rank0_state = gather_rng_states(nullptr, torch::kCPU).cpu[0].clone();
  torch::manual_seed(22);
  const torch::Tensor rank1_state = gather_rng_states(nullptr, torch::kCPU).cpu[0].clone();
  RngStates states;
  states.cpu = torch::stack({rank0_state, rank1_state});

  restore_rng_states(states, /*rank=*/1, /*world_size=*/2, torch::kCPU);
  const torch::Tensor drawn = torch::rand({4});
  torch::manual_seed(22);
  EXPECT_TRUE(torch::equal(drawn, torch::rand({4}))) << "rank 1 must continue the stream seeded 22";

  restore_rng_states(states, /*rank=*/0, /*world_size=*/2, torch::kCPU);
  const torch::Tensor drawn0 = torch::rand({4});
  torch::manual_seed(11);
  EXPECT_TRUE(torch::equal(drawn0, torch::rand({4}))) << "rank 0 must continue the stream seeded 11";
}

TEST(RngState, RowsOfAnotherWorldSizeAreRefused) {
  RngStates states = gather_rng_states(nullptr, torch::kCPU);
  EXPECT_THROW(restore_rng_states(states, 0, 2, torch::kCPU), InvalidArgument);
}

}  // namespace
}  // namespace tandem::train
