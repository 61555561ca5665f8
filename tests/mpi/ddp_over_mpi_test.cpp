// The DDP equivalence test of tests/ddp over the mpi backend: two ranks under mpirun end with the parameters
// of one process trained on the whole batch.
#include <gtest/gtest.h>

#include "ddp/ddp_fixtures.h"
#include "support/processes.h"

namespace tandem::testing {
namespace {

TEST(DdpOverMpiWorker, Run) {
  if (!is_worker_process()) GTEST_SKIP() << "runs only as a rank of DdpOverMpi";
  check_ddp_process_rank("mpi");
}

TEST(DdpOverMpi, MatchesOneProcessOnTheWholeBatch) {
  ProcessResult result = run_mpirun_ranks(2, "DdpOverMpiWorker.Run");
  ASSERT_FALSE(result.timed_out) << "mpirun hung:\n" << result.output;
  EXPECT_EQ(result.exit_code, 0) << result.output;
  size_t passed = 0;
  for (size_t at = result.output.find("[       OK ] DdpOverMpiWorker.Run"); at != std::string::npos;
       at = result.output.find("[       OK ] DdpOverMpiWorker.Run", at + 1)) {
    ++passed;
  }
  EXPECT_EQ(passed, 2u) << result.output;
}

}  // namespace
}  // namespace tandem::testing
