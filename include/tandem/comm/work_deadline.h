#pragma once
// The deadline of a collective whose backend cannot keep one: nccl. c10d's ProcessGroupNCCL queues a collective
// on a GPU stream, and its Work::wait() only makes the caller's stream wait for it (its barrier blocks the host
// without any deadline); a collective that a peer never joins is left to NCCL's watchdog, which aborts the
// process. WorkDeadline::wait polls "is it done" from the host until it is, or until the collective's deadline
// passes and it throws a message that says "timed out": the communicator base turns that into a TimeoutError
// naming the ranks that never arrived, as for gloo and mpi (docs/communicator.md).
//
// The predicate is abstract so that the logic runs on the CPU too: tests/comm/work_deadline_test.cpp drives it
// with fakes.
#include <chrono>
#include <functional>
#include <string>

namespace tandem::comm {

class WorkDeadline {
 public:
  using Clock = std::chrono::steady_clock;

  // A collective started at `started` has until started + timeout. `what` names it in the message.
  WorkDeadline(std::string what, Clock::time_point started, std::chrono::milliseconds timeout);

  // Returns once is_done() returns true; throws CommError ("... timed out ...") if the deadline passes first.
  // Polls at once, then yields the core for a while (a GPU collective usually ends within microseconds of the
  // previous kernel), then sleeps between polls, at most kLongestPause. `now` is the clock; tests pass a fake.
  void wait(const std::function<bool()>& is_done, const std::function<Clock::time_point()>& now = Clock::now) const;

  static constexpr std::chrono::microseconds kLongestPause{1000};

 private:
  std::string what_;
  Clock::time_point deadline_;
  std::chrono::milliseconds timeout_;
};

}  // namespace tandem::comm
