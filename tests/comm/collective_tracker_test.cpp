// What a failed collective's message says about the other ranks: a lost rank (it did not answer through the
// store: process gone, host or network down) is named as lost; with every rank alive, ranks in another
// collective of the same number are named with theirs, and those that never issued the collective are named
// instead. While nothing fails, the trackers write nothing to the store. Ranks are trackers on one in-memory
// store.
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <thread>

#include "tandem/comm/collective_tracker.h"
#include "tandem/comm/counting_store.h"
#include "tandem/util/error.h"

namespace tandem::comm {
namespace {

using namespace std::chrono_literals;

const CollectiveSignature kSum{"all_reduce(sum)", c10::kFloat, 8};

std::string failure_message(CollectiveTracker& tracker, uint64_t sequence, const std::string& backend_message) {
  try {
    tracker.fail("all_reduce(sum)", sequence, backend_message, 10s);
  } catch (const Error& error) {
    return error.what();
  }
}

TEST(CollectiveTracker, NamesTheRankThatWasLost) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  CollectiveTracker survivor(store, 0, 3);
  CollectiveTracker alive(store, 2, 3);
  survivor.begin(kSum);
  alive.begin(kSum);
  {
    // Rank 1 issued the collective too, then its host went away: it had reached it, and it is still lost.
    CollectiveTracker lost(store, 1, 3);
    lost.begin(kSum);
  }
  const std::string message = failure_message(survivor, 1, "Timed out waiting 10000ms for recv operation");
  EXPECT_NE(message.find("all_reduce(sum) #1 on rank 0/3 timed out after 10 s: lost rank(s) 1: no answer"),
            std::string::npos)
      << message;
  EXPECT_EQ(message.find("rank(s) 1, 2"), std::string::npos) << message;
}

TEST(CollectiveTracker, NamesLiveRanksThatNeverReachedTheCollective) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  CollectiveTracker survivor(store, 0, 3);
  CollectiveTracker ahead(store, 1, 3);
  CollectiveTracker behind(store, 2, 3);
  for (CollectiveTracker* tracker : {&survivor, &ahead, &ahead, &behind}) tracker->begin(kSum);
  const std::string message = failure_message(survivor, survivor.begin(kSum), "Connection closed by peer");
  EXPECT_NE(message.find("all_reduce(sum) #2 on rank 0/3 failed: rank(s) 2 never reached it"), std::string::npos)
      << message;
  EXPECT_EQ(message.find("lost"), std::string::npos) << message;
}

TEST(CollectiveTracker, NamesWhichRankIsInWhichCollective) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  CollectiveTracker reducing(store, 0, 3);
  CollectiveTracker waiting(store, 1, 3);
  CollectiveTracker behind(store, 2, 3);
  // Every rank agrees on collective #1; at #2 rank 0 all-reduces while rank 1 waits in a barrier, and then
  // issues more, which pushes #2 back among the collectives it remembers.
  for (CollectiveTracker* tracker : {&reducing, &waiting, &behind}) tracker->begin(kSum);
  reducing.begin({"all_reduce(avg)", c10::kFloat, 60});
  waiting.begin({"barrier", std::nullopt, 0});
  for (int i = 0; i < 5; ++i) waiting.begin(kSum);
  const std::string message = failure_message(reducing, 2, "Timed out waiting 10000ms for recv operation");
  EXPECT_NE(message.find("all_reduce(sum) #2 on rank 0/3 timed out after 10 s: collective #2 differs across ranks: "
                         "rank 0 in all_reduce(avg) float32[60], rank 1 in barrier; rank(s) 2 never reached it"),
            std::string::npos)
      << message;
  EXPECT_EQ(message.find("every rank reached it"), std::string::npos) << message;
}

TEST(CollectiveTracker, AgreeRefusesACollectiveThatDiffersOnEveryRank) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  CollectiveTracker reducing(store, 0, 2);
  CollectiveTracker waiting(store, 1, 2);
  std::string messages[2];
  auto agree = [&](CollectiveTracker& tracker, int rank) {
    try {
      tracker.agree(tracker.begin(kSum), 10s);
      tracker.agree(tracker.begin(rank == 0 ? CollectiveSignature{"all_reduce(avg)", c10::kFloat, 60}
                                            : CollectiveSignature{"barrier", std::nullopt, 0}),
                    10s);
    } catch (const CommError& error) {
      messages[rank] = error.what();
    }
  };
  std::thread other([&] { agree(waiting, 1); });
  agree(reducing, 0);
  other.join();
  for (const std::string& message : messages) {
    EXPECT_EQ(message.find("collective #2 differs across ranks: rank 0 in all_reduce(avg) float32[60], rank 1 in "
                           "barrier; every rank must issue the same collectives in the same order"),
              0u)
        << message;
  }
}

TEST(CollectiveTracker, AgreeNamesTheRankThatNeverPublished) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  CollectiveTracker waiting(store, 0, 2);
  CollectiveTracker absent(store, 1, 2);
  try {
    waiting.agree(waiting.begin(kSum), 1s);
    ADD_FAILURE() << "agree() returned without rank 1";
  } catch (const TimeoutError& error) {
    EXPECT_NE(std::string(error.what()).find("rank(s) 1 never reached it"), std::string::npos) << error.what();
  }
}

TEST(CollectiveTracker, WritesNothingToTheStoreWhileNothingFails) {
  auto shared = c10::make_intrusive<c10d::HashStore>();
  auto counted = c10::make_intrusive<CountingStore>(shared);
  CollectiveTracker tracker(counted, 0, 2);
  CollectiveTracker other(shared, 1, 2);
  // Until the tracker has polled twice (its only traffic), after 10 collectives and after 100: a tracker that
  // published by the clock would have written in that time, and one that published per collective at once.
  int issued = 0;
  for (int more : {10, 90}) {
    issued += more;
    for (int i = 0; i < more; ++i) {
      tracker.begin(kSum);
      other.begin(kSum);
    }
    const StoreTraffic before = counted->traffic();
    const auto give_up = std::chrono::steady_clock::now() + 10 * CollectiveTracker::kPoll;
    while (counted->traffic().since(before).operations < 2) {
      ASSERT_LT(std::chrono::steady_clock::now(), give_up) << "the tracker never polled the store";
      std::this_thread::sleep_for(10ms);
    }
    const StoreTraffic traffic = counted->traffic();
    EXPECT_EQ(traffic.writes, 0) << "after " << issued << " collectives";
    EXPECT_EQ(traffic.bytes_received, 0) << "after " << issued << " collectives";
  }
}

}  // namespace
}  // namespace tandem::comm
