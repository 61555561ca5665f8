// DDP as users run it: real processes joined through init_process_group, each wrapping its model with the
// default process group, must end with the parameters of one process trained on the whole batch.
#include <gtest/gtest.h>

#include <cstdlib>

#include "ddp_fixtures.h"
#include "support/gpu.h"
#include "support/processes.h"
#include "tandem/comm/process_group.h"

namespace tandem::testing {
namespace {

TEST(DdpProcessWorker, Run) {
  if (!is_worker_process()) GTEST_SKIP() << "runs only as a rank of DdpProcesses";
  check_ddp_process_rank("gloo");
}

TEST(DdpProcessOnGpuWorker, Run) {
  if (!is_worker_process()) GTEST_SKIP() << "runs only as a rank of DdpProcessesOnGpu";
  check_ddp_process_rank(gpu_test_backend(std::atoi(std::getenv("WORLD_SIZE"))), "cuda");
}

void expect_ranks_succeeded(const std::vector<ProcessResult>& results) {
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_FALSE(results[r].timed_out) << "rank " << r << " hung:\n" << results[r].output;
    EXPECT_EQ(results[r].exit_code, 0) << "rank " << r << " output:\n" << results[r].output;
    const auto line = results[r].output.find("[process parity]");
    if (line != std::string::npos) std::printf("%s\n", results[r].output.substr(line, results[r].output.find('\n', line) - line).c_str());
  }
}

TEST(DdpProcesses, MatchOneProcessOnTheWholeBatch) {
  expect_ranks_succeeded(run_worker_ranks(2, "DdpProcessWorker.Run", std::chrono::seconds(90)));
}

// The model, the batches and the buckets on the GPU: two GPUs over nccl, or one shared over gloo. Several small
// buckets, so some are reduced while backward still computes others (the stream ordering of docs/gpu.md).
TEST(DdpProcessesOnGpu, MatchOneProcessOnTheWholeBatch) {
  TANDEM_SKIP_WITHOUT_GPU();
  expect_ranks_succeeded(run_worker_ranks(2, "DdpProcessOnGpuWorker.Run", std::chrono::seconds(120)));
}

}  // namespace
}  // namespace tandem::testing
