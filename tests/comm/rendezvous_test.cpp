// The rendezvous's failure cases, which users meet first: a rank that never joins must end in a TimeoutError
// naming it, not a hang; a rendezvous port that is taken must be named in the error.
#include <gtest/gtest.h>

#include <iostream>

#include "support/listening_sockets.h"
#include "support/processes.h"
#include "tandem/comm/process_group.h"
#include "tandem/comm/rendezvous.h"
#include "tandem/util/error.h"

namespace tandem {
namespace {

TEST(MissingRankWorker, Run) {
  if (!testing::is_worker_process()) GTEST_SKIP() << "runs only as a rank of Rendezvous.MissingRankTimesOutNamingIt";
  InitOptions options;
  options.backend = "gloo";
  options.timeout = std::chrono::seconds(3);
  try {
    init_process_group(options);
    FAIL() << "joined a world of 3 although only 2 ranks were started";
  } catch (const TimeoutError& error) {
    std::cout << "timeout: " << error.what() << std::endl;
  }
}

TEST(Rendezvous, MissingRankTimesOutNamingIt) {
  // Two processes told WORLD_SIZE=3: rank 2 never comes.
  auto results = testing::run_worker_ranks(2, "MissingRankWorker.Run", std::chrono::seconds(30), {{"WORLD_SIZE", "3"}});
  for (size_t rank = 0; rank < results.size(); ++rank) {
    const auto& result = results[rank];
    ASSERT_FALSE(result.timed_out) << "rank " << rank << " hung instead of timing out:\n" << result.output;
    EXPECT_EQ(result.exit_code, 0) << "rank " << rank << ":\n" << result.output;
    EXPECT_NE(result.output.find("timeout: rendezvous timed out after 3 s on rank " + std::to_string(rank) +
                                 ": rank(s) 2 of 3 never joined"),
              std::string::npos)
        << "rank " << rank << ":\n"
        << result.output;
  }
}

TEST(Rendezvous, BusyPortIsNamedInTheError) {
  testing::HeldPort busy;
  comm::RankLayout layout;
  layout.rank = 0;
  layout.world_size = 2;
  layout.master_addr = "127.0.0.1";
  layout.master_port = busy.port();
  try {
    comm::make_store("env://", layout, std::chrono::seconds(3));
    FAIL() << "rank 0 opened port " << busy.port() << " although it was taken";
  } catch (const CommError& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("127.0.0.1:" + std::to_string(busy.port())), std::string::npos) << message;
    EXPECT_NE(message.find("`master_port`"), std::string::npos) << message;
  }
}

}  // namespace
}  // namespace tandem
