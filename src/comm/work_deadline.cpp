#include "tandem/comm/work_deadline.h"

#include <fmt/format.h>

#include <algorithm>
#include <thread>

#include "tandem/util/error.h"

namespace tandem::comm {
namespace {

// Polls that only yield before the first sleep: a few microseconds of a busy core, about what a short
// collective takes to finish once its kernel runs.
constexpr int kYieldingPolls = 64;

}  // namespace

WorkDeadline::WorkDeadline(std::string what, Clock::time_point started, std::chrono::milliseconds timeout)
    : what_(std::move(what)), deadline_(started + timeout), timeout_(timeout) {}

void WorkDeadline::wait(const std::function<bool()>& is_done, const std::function<Clock::time_point()>& now) const {
  std::chrono::microseconds pause{1};
  for (int poll = 0;; ++poll) {
    if (is_done()) return;
    if (now() >= deadline_) {
      throw CommError(fmt::format("{} timed out: not complete {:.0f} s after it started", what_,
                                  timeout_.count() / 1000.0));
    }
    if (poll < kYieldingPolls) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, kLongestPause);
    }
  }
}

}  // namespace tandem::comm
