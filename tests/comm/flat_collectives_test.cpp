// The two collectives FSDP is built on, over gloo on ranks as threads: all_gather_into (one flat output) and
// reduce_scatter (a flat input's chunk per rank), against values computed by hand on 1 to 4 ranks. On LibTorch
// 1.13 both are the communicator base's emulations (c10d's Gloo has neither); on 2.11 Gloo's own.
#include <gtest/gtest.h>

#include <string>

#include "support/thread_ranks.h"
#include "tandem/util/error.h"

namespace tandem::flat_collectives_test {
namespace {

using comm::Communicator;
using comm::ReduceOp;

// Rank r's input: r * 100 + 0, 1, 2, ... so every element says where it came from.
torch::Tensor rank_values(int rank, int64_t numel) {
  return torch::arange(numel, torch::kFloat32) + 100.0 * rank;
}

std::string refusal(const std::function<void()>& call) {
  try {
    call();
  } catch (const InvalidArgument& error) {
    return error.what();
  }
  return "(not refused)";
}

class FlatCollectives : public ::testing::TestWithParam<int> {};

TEST_P(FlatCollectives, AllGatherIntoOneTensorPlacesEachRankInItsSlice) {
  const int world = GetParam();
  testing::run_thread_ranks(world, [world](int rank, Communicator& comm) {
    for (int64_t numel : {int64_t{1}, int64_t{7}, int64_t{1} << 16}) {
      torch::Tensor output = torch::full({world * numel}, -1.0f);
      comm.all_gather_into(output, rank_values(rank, numel))->wait();
      for (int r = 0; r < world; ++r) {
        EXPECT_TRUE(output.narrow(0, r * numel, numel).equal(rank_values(r, numel)))
            << "rank " << rank << " sees rank " << r << "'s slice wrong at " << numel << " elements";
      }
    }
    // A shaped input lands flat in the output as well.
    torch::Tensor output = torch::zeros({world, 2, 3});
    comm.all_gather_into(output, rank_values(rank, 6).view({2, 3}))->wait();
    EXPECT_TRUE(output[world - 1].equal(rank_values(world - 1, 6).view({2, 3})));
  });
}

TEST_P(FlatCollectives, ReduceScatterGivesEachRankItsChunkSummedOrAveraged) {
  const int world = GetParam();
  testing::run_thread_ranks(world, [world](int rank, Communicator& comm) {
    for (int64_t chunk : {int64_t{1}, int64_t{5}, int64_t{1} << 14}) {
      const torch::Tensor input = rank_values(rank, world * chunk);
      // Over ranks: sum_r (r*100 + i) = 100 * world(world-1)/2 + world * i, for the i of this rank's chunk.
      const torch::Tensor index = torch::arange(rank * chunk, (rank + 1) * chunk, torch::kFloat32);
      const torch::Tensor sum = index * world + 100.0 * world * (world - 1) / 2;
      torch::Tensor output = torch::empty({chunk});
      comm.reduce_scatter(output, input, ReduceOp::Sum)->wait();
      EXPECT_TRUE(torch::allclose(output, sum)) << "sum, rank " << rank << ", chunk " << chunk;
      comm.reduce_scatter(output, input, ReduceOp::Avg)->wait();
      EXPECT_TRUE(torch::allclose(output, sum / world)) << "avg, rank " << rank << ", chunk " << chunk;
      EXPECT_TRUE(input.equal(rank_values(rank, world * chunk))) << "the input must stay as it was";
    }
  });
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, FlatCollectives, ::testing::Values(1, 2, 3, 4));

TEST(FlatCollectives, UnevenSizesAreRefusedInOneLine) {
  testing::run_thread_ranks(2, [](int, Communicator& comm) {
    torch::Tensor gathered = torch::empty({7});
    EXPECT_EQ(refusal([&] { comm.all_gather_into(gathered, torch::ones({3})); }),
              "all_gather_into output has 7 elements; it must be world size 2 x input's 3");
    torch::Tensor chunk = torch::empty({3});
    EXPECT_EQ(refusal([&] { comm.reduce_scatter(chunk, torch::ones({7})); }),
              "reduce_scatter input has 7 elements; it must be world size 2 x output's 3");
    torch::Tensor strided = torch::empty({6, 2}).t();
    EXPECT_EQ(refusal([&] { comm.all_gather_into(strided, torch::ones({6})); }),
              "all_gather_into needs a contiguous output tensor; pass output.contiguous() and use it");
    // Both ranks refused before any collective started, so the next one still pairs up.
    torch::Tensor value = torch::ones({1});
    comm.all_reduce(value)->wait();
    EXPECT_EQ(value.item<float>(), 2.0f);
  });
}

}  // namespace
}  // namespace tandem::flat_collectives_test
