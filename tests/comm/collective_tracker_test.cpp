// What a failed collective's message says about the other ranks: a lost rank (its value in the store stood
// still: process gone, host or network down) is named as lost; with every rank alive, those that never
// issued the collective are named instead. Ranks are trackers on one in-memory store.
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <thread>

#include "tandem/comm/collective_tracker.h"
#include "tandem/util/error.h"

namespace tandem::comm {
namespace {

using namespace std::chrono_literals;

// Waits (bounded) until `rank` has published that it issued `count` collectives.
void wait_until_published(c10d::Store& store, int rank, uint64_t count) {
  const std::string key = "tandem/progress/" + std::to_string(rank);
  const std::string expected = std::to_string(count) + " ";
  const auto give_up = std::chrono::steady_clock::now() + 10s;
  while (true) {
    if (store.check({key})) {
      auto bytes = store.get(key);
      if (std::string(bytes.begin(), bytes.end()).rfind(expected, 0) == 0) return;
    }
    ASSERT_LT(std::chrono::steady_clock::now(), give_up) << "rank " << rank << " never published " << count;
    std::this_thread::sleep_for(10ms);
  }
}

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
  survivor.begin();
  alive.begin();
  {
    // Rank 1 issued the collective too, then its host went away: it had reached it, and it is still lost.
    CollectiveTracker lost(store, 1, 3);
    lost.begin();
    wait_until_published(*store, 1, 1);
  }
  wait_until_published(*store, 2, 1);
  const std::string message = failure_message(survivor, 1, "Timed out waiting 10000ms for recv operation");
  EXPECT_NE(message.find("all_reduce(sum) #1 on rank 0/3 timed out after 10 s: lost rank(s) 1: no heartbeat"),
            std::string::npos)
      << message;
  EXPECT_EQ(message.find("rank(s) 1, 2"), std::string::npos) << message;
}

TEST(CollectiveTracker, NamesLiveRanksThatNeverReachedTheCollective) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  CollectiveTracker survivor(store, 0, 3);
  CollectiveTracker ahead(store, 1, 3);
  CollectiveTracker behind(store, 2, 3);
  for (CollectiveTracker* tracker : {&survivor, &ahead, &ahead, &behind}) tracker->begin();
  wait_until_published(*store, 1, 2);
  wait_until_published(*store, 2, 1);
  const std::string message = failure_message(survivor, survivor.begin(), "Connection closed by peer");
  EXPECT_NE(message.find("all_reduce(sum) #2 on rank 0/3 failed: rank(s) 2 never reached it"), std::string::npos)
      << message;
  EXPECT_EQ(message.find("lost"), std::string::npos) << message;
}

}  // namespace
}  // namespace tandem::comm
