// What a user reads when a collective cannot complete: a timeout names the ranks that never reached the
// collective, and a peer that died is named as the rank that never arrived, with a hint that it exited.
#include <gtest/gtest.h>

#include <cstdlib>
#include <future>
#include <string>

#include "support/processes.h"
#include "support/thread_ranks.h"
#include "tandem/comm/process_group.h"
#include "tandem/util/error.h"

namespace tandem {
namespace {

TEST(CollectiveFailure, TimeoutNamesTheRankThatNeverArrived) {
  std::vector<std::string> errors(3);
  // Rank 2 stays connected but skips the collective; it leaves once the others have given up.
  std::promise<void> others_done[2];
  std::shared_future<void> done0 = others_done[0].get_future().share(), done1 = others_done[1].get_future().share();
  testing::run_thread_ranks(
      3,
      [&](int rank, comm::Communicator& communicator) {
        if (rank == 2) {
          done0.wait();
          done1.wait();
          return;
        }
        torch::Tensor values = torch::ones({8});
        try {
          communicator.all_reduce(values, comm::ReduceOp::Sum)->wait();
        } catch (const TimeoutError& error) {
          errors[rank] = error.what();
        }
        others_done[rank].set_value();
      },
      std::chrono::seconds(2));
  for (int rank : {0, 1}) {
    std::printf("[rank %d] %s\n", rank, errors[rank].c_str());
    EXPECT_NE(errors[rank].find("timed out after 2 s"), std::string::npos) << errors[rank];
    EXPECT_NE(errors[rank].find("rank(s) 2 never reached it"), std::string::npos) << errors[rank];
  }
}

TEST(DeadPeerWorker, Run) {
  if (!testing::is_worker_process()) GTEST_SKIP() << "runs only as a rank of DeadPeer";
  InitOptions options;
  options.backend = "gloo";
  options.timeout = std::chrono::seconds(60);
  init_process_group(options);
  barrier();
  if (rank() == 1) std::_Exit(0);  // dies without a word, as a killed process would
  torch::Tensor values = torch::ones({8});
  try {
    default_group().communicator().all_reduce(values, comm::ReduceOp::Sum)->wait();
    ADD_FAILURE() << "an all-reduce with a dead peer completed";
  } catch (const CommError& error) {
    std::printf("DEAD PEER SEEN: %s\n", error.what());
  }
  std::fflush(stdout);
  std::_Exit(::testing::Test::HasFailure() ? 1 : 0);
}

TEST(DeadPeer, SurvivorNamesTheRankThatDied) {
  const auto results = testing::run_worker_ranks(2, "DeadPeerWorker.Run", std::chrono::seconds(60));
  ASSERT_FALSE(results[0].timed_out) << "the survivor waited for the dead peer:\n" << results[0].output;
  EXPECT_EQ(results[0].exit_code, 0) << results[0].output;
  EXPECT_NE(results[0].output.find("DEAD PEER SEEN: "), std::string::npos) << results[0].output;
  EXPECT_NE(results[0].output.find("lost rank(s) 1: no answer"), std::string::npos) << results[0].output;
}

}  // namespace
}  // namespace tandem
