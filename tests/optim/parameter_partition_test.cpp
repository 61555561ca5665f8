// The greedy partition that every rank computes alone: largest parameter first to the least-loaded rank, ties to
// the earlier parameter and the lower rank.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "tandem/optim/parameter_partition.h"
#include "tandem/util/error.h"

namespace tandem::optim {
namespace {

std::vector<torch::Tensor> of_sizes(const std::vector<int64_t>& sizes) {
  std::vector<torch::Tensor> parameters;
  for (int64_t size : sizes) parameters.push_back(torch::zeros({size}));
  return parameters;
}

TEST(ParameterPartition, GivesTheLargestFirstToTheLeastLoadedRank) {
  // In elements, largest first: 9 -> rank 0, 7 -> 1, 5 -> 2, 4 -> 2 (least: 5), 3 -> 1 (least: 7), 1 -> 0 (ranks 0
  // and 2 tie at 9).
  const ParameterPartition partition = partition_parameters(of_sizes({3, 9, 1, 5, 7, 4}), 3);
  EXPECT_EQ(partition.owner, (std::vector<int>{1, 0, 0, 2, 1, 2}));
  EXPECT_EQ(partition.rank_bytes, (std::vector<int64_t>{40, 40, 36}));
}

TEST(ParameterPartition, BreaksTiesByParameterOrderThenRank) {
  const ParameterPartition partition = partition_parameters(of_sizes({2, 2, 2, 2, 2}), 2);
  EXPECT_EQ(partition.owner, (std::vector<int>{0, 1, 0, 1, 0}));
}

TEST(ParameterPartition, WeighsBytesNotElements) {
  std::vector<torch::Tensor> parameters = {torch::zeros({10}, torch::kFloat64), torch::zeros({12}, torch::kFloat32),
                                           torch::zeros({8}, torch::kFloat32)};
  const ParameterPartition partition = partition_parameters(parameters, 2);
  EXPECT_EQ(partition.owner, (std::vector<int>{0, 1, 1}));
  EXPECT_EQ(partition.rank_bytes, (std::vector<int64_t>{80, 80}));
}

TEST(ParameterPartition, AWorldOfOneOwnsEverythingAndSpareRanksOwnNothing) {
  EXPECT_EQ(partition_parameters(of_sizes({4, 1, 3}), 1).owner, (std::vector<int>{0, 0, 0}));
  const ParameterPartition spare = partition_parameters(of_sizes({4, 1}), 3);
  EXPECT_EQ(spare.owner, (std::vector<int>{0, 1}));
  EXPECT_EQ(spare.rank_bytes, (std::vector<int64_t>{16, 4, 0}));
}

TEST(ParameterPartition, RefusesAnEmptyWorld) {
  EXPECT_THROW(partition_parameters(of_sizes({1}), 0), InvalidArgument);
}

}  // namespace
}  // namespace tandem::optim
