// call_within (call_within.h): a call's answer or exception within the timeout; past it, or once interrupted,
// nothing, while the abandoned call runs on with what it owns and finishes safely after the caller left.
#include "tandem/util/call_within.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <stdexcept>
#include <string>

namespace tandem {
namespace {

using namespace std::chrono_literals;

TEST(CallWithin, HandsBackTheAnswerOrTheException) {
  EXPECT_EQ(call_within(10s, [] { return std::string("answer"); }), std::optional<std::string>("answer"));
  EXPECT_TRUE(call_within(10s, [] {}).has_value());
  EXPECT_THROW(call_within(10s, []() -> int { throw std::runtime_error("refused"); }), std::runtime_error);
}

// The abandoned call is held up until the caller has left, then finishes: what it writes is its own (a value
// it owns, kept alive by a shared_ptr the test holds too), and the answer it sets goes to a slot that still exists.
TEST(CallWithin, AnAbandonedCallFinishesAfterTheCallerLeft) {
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  auto finished = std::make_shared<std::atomic<bool>>(false);
  std::promise<void> done;
  std::future<void> done_seen = done.get_future();
  auto done_slot = std::make_shared<std::promise<void>>(std::move(done));
  const std::optional<int> answer = call_within(50ms, [released, finished, done_slot] {
    released.wait();
    finished->store(true);
    done_slot->set_value();
    return 7;
  });
  EXPECT_FALSE(answer.has_value());
  EXPECT_FALSE(finished->load());
  release.set_value();
  ASSERT_EQ(done_seen.wait_for(10s), std::future_status::ready);
  EXPECT_TRUE(finished->load());
}

TEST(CallWithin, AnInterruptionEndsTheWaitBeforeTheTimeout) {
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  int asked = 0;
  const std::optional<int> answer = call_within(
      1h,
      [released] {
        released.wait();
        return 1;
      },
      [&asked] { return ++asked == 2; });
  EXPECT_FALSE(answer.has_value());
  EXPECT_EQ(asked, 2);
  release.set_value();
}

}  // namespace
}  // namespace tandem
