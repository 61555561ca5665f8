// Restoring a rank's random generator from its row of all ranks' states: rank 1's row lies at an offset inside
// the tensor (inside the checkpoint file's buffer once loaded), and LibTorch 2.x reads a state from the start of
// its storage, so the row must reach the generator on its own. And the devices a rank draws from: DataParallel
// over several GPUs checkpointed only the first one's generator, so a resume drew other dropout masks on the
// rest. The device-list logic is checked here on the CPU (its generator standing in for each device).
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "tandem/checkpoint/rng_state.h"
#include "tandem/util/error.h"

namespace tandem::checkpoint {
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

// A run continued on another world size (issue 31): ranks the checkpoint had keep their streams, a new rank
// draws from new_rank_seed(seed, rank), and the rows of ranks beyond the new world are dropped.
TEST(RngState, AContinuedWorldKeepsTheRanksItSharesAndSeedsNewOnesFromTheRunSeed) {
  torch::manual_seed(11);
  const torch::Tensor rank0_state = gather_rng_states(nullptr, torch::kCPU).cpu[0].clone();
  torch::manual_seed(22);
  const torch::Tensor rank1_state = gather_rng_states(nullptr, torch::kCPU).cpu[0].clone();
  RngStates states;
  states.cpu = torch::stack({rank0_state, rank1_state});

  const auto drawn_by = [&](int rank) {
    torch::manual_seed(99);  // whatever the rank had before must not matter
    continue_rng_states(states, rank, /*seed=*/5, {torch::kCPU});
    return torch::rand({4});
  };
  const torch::Tensor rank1 = drawn_by(1), rank2 = drawn_by(2), rank3 = drawn_by(3);
  torch::manual_seed(22);
  EXPECT_TRUE(torch::equal(rank1, torch::rand({4}))) << "rank 1 of a larger world continues its own row";
  torch::manual_seed(new_rank_seed(5, 2));
  EXPECT_TRUE(torch::equal(rank2, torch::rand({4}))) << "rank 2 starts the stream of its own seed";
  EXPECT_FALSE(torch::equal(rank2, rank3)) << "new ranks draw different streams";
  EXPECT_TRUE(torch::equal(drawn_by(2), rank2)) << "the same in every run with that seed";
  EXPECT_NE(new_rank_seed(5, 2), new_rank_seed(6, 2));
  EXPECT_NE(new_rank_seed(5, 2), 5u);
  // A world of one keeps rank 0's row and drops rank 1's.
  const torch::Tensor rank0 = drawn_by(0);
  torch::manual_seed(11);
  EXPECT_TRUE(torch::equal(torch::rand({4}), rank0));
}

std::string error_of(const std::function<void()>& call) {
  try {
    call();
  } catch (const InvalidArgument& error) {
    return error.what();
  }
  ADD_FAILURE() << "expected InvalidArgument";
  return "";
}

TEST(RngState, GeneratorDevicesAreTheAcceleratorsEachOnceInOrder) {
  const torch::Device cpu(torch::kCPU), gpu0(torch::kCUDA, 0), gpu1(torch::kCUDA, 1), gpu2(torch::kCUDA, 2);
  EXPECT_TRUE(generator_devices({cpu, cpu, cpu}).empty()) << "CPU replicas share the CPU generator";
  EXPECT_EQ(generator_devices({gpu0}), (std::vector<torch::Device>{gpu0}));
  EXPECT_EQ(generator_devices({gpu2, gpu0, gpu1, gpu0}), (std::vector<torch::Device>{gpu2, gpu0, gpu1}));
  EXPECT_EQ(generator_devices({gpu1, cpu, gpu0}), (std::vector<torch::Device>{gpu1, gpu0}));
}

TEST(RngState, EveryDeviceGivenGetsItsOwnRowAndItsStateBack) {
  const std::vector<torch::Device> three = {torch::kCPU, torch::kCPU, torch::kCPU};
  torch::manual_seed(5);
  const torch::Tensor states = capture_generators(three);
  ASSERT_EQ(states.dim(), 2);
  EXPECT_EQ(states.size(0), 3) << "one row per device given";
  EXPECT_EQ(states.scalar_type(), torch::kUInt8);
  const torch::Tensor expected = torch::rand({4});

  torch::manual_seed(6);
  restore_generators(states, three);
  EXPECT_TRUE(torch::equal(torch::rand({4}), expected)) << "the captured stream continues";
  EXPECT_EQ(capture_generators({}).size(0), 0);
}

TEST(RngState, AnotherNumberOfDevicesIsRefusedInOneLineBeforeAnyGeneratorIsSet) {
  torch::manual_seed(7);
  const torch::Tensor two = capture_generators({torch::kCPU, torch::kCPU});
  torch::manual_seed(8);
  const torch::Tensor before = capture_generators({torch::kCPU});
  const std::string error = error_of([&] { restore_generators(two, {torch::kCPU}); });
  EXPECT_NE(error.find("the checkpoint holds the random generators of 2 devices, but this run draws from 1"),
            std::string::npos)
      << error;
  EXPECT_EQ(error.find('\n'), std::string::npos) << error;
  EXPECT_TRUE(torch::equal(capture_generators({torch::kCPU}), before)) << "nothing was set";

  // Through a checkpoint's rows: a DataParallel run on 2 GPUs resumed on 3 (refused before any GPU is touched,
  // so this runs without one), and a checkpoint of an older build, one device's [world, bytes], on 2.
  const torch::Device gpu0(torch::kCUDA, 0), gpu1(torch::kCUDA, 1), gpu2(torch::kCUDA, 2);
  RngStates states = gather_rng_states(nullptr, torch::kCPU);
  states.device = two.unsqueeze(0);  // [world 1, devices 2, bytes]
  EXPECT_NE(error_of([&] { restore_rng_states(states, 0, 1, {gpu0, gpu1, gpu2}); })
                .find("random generators of 2 devices, but this run draws from 3"),
            std::string::npos);
  states.device = two[0].unsqueeze(0);  // [world 1, bytes]
  EXPECT_NE(error_of([&] { restore_rng_states(states, 0, 1, {gpu0, gpu1}); })
                .find("random generators of 1 device, but this run draws from 2"),
            std::string::npos);
  // The CPU replicas of a CPU run share one generator: a checkpoint's device rows are not theirs.
  EXPECT_NO_THROW(restore_rng_states(states, 0, 1, {torch::kCPU, torch::kCPU}));
}

}  // namespace
}  // namespace tandem::checkpoint
