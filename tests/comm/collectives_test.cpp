// Every collective of the gloo backend against values computed by hand, on ranks as threads (fast) and as
// real processes joined through init_process_group (what users run).
#include <gtest/gtest.h>

#include "support/processes.h"
#include "support/thread_ranks.h"
#include "tandem/comm/process_group.h"

namespace tandem {
namespace {

using comm::Communicator;
using comm::ReduceOp;

// Rank r holds r+1+i*0.5 at element i: distinct per rank and element, exact in float32 for these sizes.
torch::Tensor rank_values(int rank, int64_t numel, torch::ScalarType dtype) {
  return (torch::arange(numel, torch::kFloat64) * 0.5 + (rank + 1)).to(dtype);
}

void check_all_collectives(int rank, Communicator& comm, int64_t numel, torch::ScalarType dtype) {
  const int world = comm.world_size();
  const auto expected_for = [&](int r) { return rank_values(r, numel, dtype); };
  torch::Tensor sum = torch::zeros({numel}, dtype), max = expected_for(0), min = expected_for(0);
  for (int r = 0; r < world; ++r) {
    sum += expected_for(r);
    max = torch::max(max, expected_for(r));
    min = torch::min(min, expected_for(r));
  }

  struct Case {
    ReduceOp op;
    torch::Tensor expected;
  };
  for (const Case& c : {Case{ReduceOp::Sum, sum}, Case{ReduceOp::Avg, sum / world}, Case{ReduceOp::Min, min},
                        Case{ReduceOp::Max, max}}) {
    torch::Tensor tensor = rank_values(rank, numel, dtype);
    comm.all_reduce(tensor, c.op)->wait();
    EXPECT_TRUE(torch::allclose(tensor, c.expected)) << "all_reduce " << comm::to_string(c.op) << " numel " << numel;
  }

  for (int root : {0, world - 1}) {
    torch::Tensor tensor = rank_values(rank, numel, dtype);
    comm.broadcast(tensor, root)->wait();
    EXPECT_TRUE(torch::equal(tensor, expected_for(root))) << "broadcast from " << root << " numel " << numel;
  }

  std::vector<torch::Tensor> gathered(world);
  for (auto& out : gathered) out = torch::empty({numel}, dtype);
  comm.all_gather(gathered, rank_values(rank, numel, dtype))->wait();
  for (int r = 0; r < world; ++r) EXPECT_TRUE(torch::equal(gathered[r], expected_for(r))) << "all_gather slot " << r;

  // reduce_scatter needs equal chunks: each rank contributes world*numel elements.
  torch::Tensor input = rank_values(rank, numel * world, dtype);
  torch::Tensor output = torch::empty({numel}, dtype);
  comm.reduce_scatter(output, input, ReduceOp::Sum)->wait();
  torch::Tensor all = torch::zeros({numel * world}, dtype);
  for (int r = 0; r < world; ++r) all += rank_values(r, numel * world, dtype);
  EXPECT_TRUE(torch::allclose(output, all.view({world, numel})[rank])) << "reduce_scatter numel " << numel;

  comm.barrier()->wait();
}

class ThreadCollectives : public ::testing::TestWithParam<int> {};

TEST_P(ThreadCollectives, MatchHandComputedValues) {
  const int world = GetParam();
  // 1 element, an odd size that no world size divides, and ~4 MB of float32.
  testing::run_thread_ranks(world, [](int rank, Communicator& comm) {
    for (auto dtype : {torch::kFloat32, torch::kFloat64}) {
      for (int64_t numel : {int64_t{1}, int64_t{1001}, int64_t{1} << 20}) check_all_collectives(rank, comm, numel, dtype);
    }
  });
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, ThreadCollectives, ::testing::Values(2, 4));

TEST(ProcessCollectivesWorker, Run) {
  if (!testing::is_worker_process()) GTEST_SKIP() << "runs only as a rank of ProcessCollectives";
  InitOptions options;
  options.backend = "gloo";
  options.timeout = std::chrono::seconds(30);
  init_process_group(options);
  ASSERT_EQ(world_size(), std::stoi(std::getenv("WORLD_SIZE")));
  ASSERT_EQ(rank(), std::stoi(std::getenv("RANK")));
  for (auto dtype : {torch::kFloat32, torch::kFloat64}) {
    for (int64_t numel : {int64_t{1}, int64_t{1001}, int64_t{3} << 20}) {
      check_all_collectives(rank(), default_group().communicator(), numel, dtype);
    }
  }
  // The seeds' reduce_value: mean of the ranks' values.
  torch::Tensor value = torch::tensor({static_cast<double>(rank())});
  EXPECT_DOUBLE_EQ(reduce_value(value, true).item<double>(), (world_size() - 1) / 2.0);
  destroy_process_group();
}

class ProcessCollectives : public ::testing::TestWithParam<int> {};

TEST_P(ProcessCollectives, MatchHandComputedValues) {
  auto results = testing::run_worker_ranks(GetParam(), "ProcessCollectivesWorker.Run");
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_FALSE(results[r].timed_out) << "rank " << r << " hung:\n" << results[r].output;
    EXPECT_EQ(results[r].exit_code, 0) << "rank " << r << " output:\n" << results[r].output;
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, ProcessCollectives, ::testing::Values(2, 4));

}  // namespace
}  // namespace tandem
