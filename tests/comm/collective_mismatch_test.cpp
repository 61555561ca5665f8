// Ranks that issue different collectives under one sequence number (rank 0 all-reduces while rank 1 waits in a
// barrier) are told so in one line naming each rank's collective: always when the collective times out, and
// under TANDEM_DISTRIBUTED_DEBUG=DETAIL before it starts, so that the transport never sees the mismatch.
#include <gtest/gtest.h>

#include <cstdlib>
#include <future>
#include <optional>
#include <string>

#include "support/thread_ranks.h"
#include "tandem/util/error.h"

namespace tandem {
namespace {

constexpr const char* kMismatch =
    "collective #2 differs across ranks: rank 0 in all_reduce(avg) float32[60], rank 1 in barrier";

// Sets TANDEM_DISTRIBUTED_DEBUG for one test; communicators read it as they are made.
class DebugLevel {
 public:
  explicit DebugLevel(const char* level) {
    if (const char* before = std::getenv(kName)) before_ = before;
    ::setenv(kName, level, 1);
  }
  ~DebugLevel() {
    if (before_) {
      ::setenv(kName, before_->c_str(), 1);
    } else {
      ::unsetenv(kName);
    }
  }

 private:
  static constexpr const char* kName = "TANDEM_DISTRIBUTED_DEBUG";
  std::optional<std::string> before_;
};

// Both ranks agree on collective #1; at #2 rank 0 all-reduces 60 floats and rank 1 enters a barrier. Returns
// each rank's error message. Neither rank leaves before both have failed, so that each fails on its own
// collective rather than on the other's departure.
std::vector<std::string> mismatched_collectives(std::chrono::milliseconds timeout) {
  std::vector<std::string> errors(2);
  std::promise<void> failed[2];
  std::shared_future<void> both_failed[2] = {failed[0].get_future().share(), failed[1].get_future().share()};
  testing::run_thread_ranks(
      2,
      [&](int rank, comm::Communicator& communicator) {
        torch::Tensor agreed = torch::ones({4});
        communicator.all_reduce(agreed, comm::ReduceOp::Sum)->wait();
        try {
          if (rank == 0) {
            torch::Tensor values = torch::ones({60});
            communicator.all_reduce(values, comm::ReduceOp::Avg)->wait();
          } else {
            communicator.barrier()->wait();
          }
        } catch (const CommError& error) {
          errors[static_cast<size_t>(rank)] = error.what();
        }
        failed[rank].set_value();
        both_failed[1 - rank].wait();
      },
      timeout);
  return errors;
}

TEST(CollectiveMismatch, DetailRefusesItOnEveryRankBeforeTheTransport) {
  DebugLevel detail("DETAIL");
  const std::vector<std::string> errors = mismatched_collectives(std::chrono::seconds(30));
  for (int rank : {0, 1}) {
    std::printf("[rank %d] %s\n", rank, errors[rank].c_str());
    EXPECT_EQ(errors[rank].find(kMismatch), 0u) << errors[rank];
    EXPECT_EQ(errors[rank].find("timed out"), std::string::npos) << errors[rank];
  }
}

TEST(CollectiveMismatch, TimeoutNamesEachRanksCollective) {
  DebugLevel off("OFF");
  const std::vector<std::string> errors = mismatched_collectives(std::chrono::seconds(2));
  // The first rank to time out closes its connections, so the other may fail on the closed pair before its own
  // deadline: either way each rank's one line says which rank is in which collective.
  int timed_out = 0;
  for (int rank : {0, 1}) {
    std::printf("[rank %d] %s\n", rank, errors[rank].c_str());
    EXPECT_NE(errors[rank].find(": " + std::string(kMismatch)), std::string::npos) << errors[rank];
    if (errors[rank].find("timed out after 2 s: " + std::string(kMismatch)) != std::string::npos) ++timed_out;
  }
  EXPECT_GE(timed_out, 1) << "at least the first rank's deadline passed";
}

TEST(CollectiveMismatch, UnknownDebugLevelIsRefusedByName) {
  DebugLevel info("INFO");
  try {
    testing::run_thread_ranks(1, [](int, comm::Communicator&) {});
    ADD_FAILURE() << "a communicator was made under TANDEM_DISTRIBUTED_DEBUG=INFO";
  } catch (const InvalidArgument& error) {
    EXPECT_NE(std::string(error.what()).find("TANDEM_DISTRIBUTED_DEBUG=INFO is not a debug level"), std::string::npos)
        << error.what();
  }
}

}  // namespace
}  // namespace tandem
