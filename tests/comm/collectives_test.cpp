// Every collective of the gloo backend against values computed by hand, on ranks as threads (fast) and as
// real processes joined through init_process_group (what users run).
#include <gtest/gtest.h>

#include "support/collective_checks.h"
#include "support/gpu.h"
#include "support/processes.h"
#include "support/thread_ranks.h"
#include "tandem/comm/process_group.h"

namespace tandem {
namespace {

using comm::Communicator;
using testing::check_all_collectives;

class ThreadCollectives : public ::testing::TestWithParam<int> {};

TEST_P(ThreadCollectives, MatchHandComputedValues) {
  const int world = GetParam();
  // 1 element, an odd size that no world size divides, and ~4 MB of float32.
  testing::run_thread_ranks(world, [](int rank, Communicator& comm) {
    for (auto dtype : {torch::kFloat32, torch::kFloat64}) {
      for (int64_t numel : {int64_t{1}, int64_t{1001}, int64_t{1} << 20}) check_all_collectives(rank, comm, numel, dtype);
    }
    testing::check_average_edges(rank, comm);
    testing::check_emulated_reductions(rank, comm);
  });
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, ThreadCollectives, ::testing::Values(2, 4));

// Two ranks with CUDA tensors: one GPU each over nccl where there are two, else both on one GPU over gloo,
// which stages CUDA tensors through the host (the only way two ranks can share a GPU).
TEST(ThreadCollectivesOnGpu, TwoRanksMatchHandComputedValues) {
  TANDEM_SKIP_WITHOUT_GPU();
  testing::run_gpu_thread_ranks(2, [](int rank, Communicator& comm, torch::Device device) {
    for (int64_t numel : {int64_t{1}, int64_t{1001}, int64_t{1} << 20}) {
      check_all_collectives(rank, comm, numel, torch::kFloat32, device);
    }
  });
}

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
