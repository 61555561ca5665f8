// Who a log line says is speaking: a rank names itself ("[tandem rank r/N] "); a process that joined no process
// group (the launcher, `tandem report`) is no rank and says "tandem: ", which the program's own error lines
// start with too (tests/apps/bad_program_inputs_test.cpp checks those through the built program).
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <thread>

#include "tandem/util/log.h"

namespace tandem::log::log_identity {
namespace {

TEST(LogIdentity, AProcessThatIsNoRankSaysTandem) {
  // "threadsafe" runs the child as a fresh start of this test binary, where no other test has set an identity.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        write("error: ", "no rank here");
        std::exit(identity_rank() == 0 && identity_world_size() == 1 ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "^tandem: error: no rank here\n$");
}

TEST(LogIdentity, ARankThreadNamesItsRankAndWorldSize) {
  std::string prefix;
  int rank = -1;
  int world_size = -1;
  std::thread rank_thread([&] {
    set_identity(3, 8);
    prefix = line_prefix();
    rank = identity_rank();
    world_size = identity_world_size();
  });
  rank_thread.join();
  EXPECT_EQ(prefix, "[tandem rank 3/8] ");
  EXPECT_EQ(rank, 3);
  EXPECT_EQ(world_size, 8);
}

}  // namespace
}  // namespace tandem::log::log_identity
