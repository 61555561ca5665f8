#pragma once
// One rank's record of where a window of training steps spends its time, for `tandem train --timeline` and
// `tandem bench train`. Each step is a span on the training lane, holding its forward, backward (which holds
// the wait for the gradient all-reduces at its end) and optimizer spans; each gradient bucket's all-reduce is a
// span on a lane of its own, from the moment the reducer launched it to the moment the backend completed it.
//
//   monitor::Timeline timeline({first_step, last_step});
//   timeline.begin_step(step);                       // the training thread, before the step's work
//   { monitor::TimelineSpan span(&timeline, "forward"); ... }
//   ...
//   timeline.end_step();
//
// Spans of steps outside the window are dropped, so instrumented code needs no checks of its own. The training
// thread records the training lane; the reducer records the all-reduce lanes, also on the training thread (the
// autograd engine's callbacks), with completion times that the backends' threads reported: a mutex guards it
// all. Times are microseconds since the timeline's origin (see set_origin).
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace tandem::monitor {

using TimelineClock = std::chrono::steady_clock;

// The steps to record, 1-based as LoopOptions counts them (step 1 is the run's first optimizer step), inclusive.
struct StepWindow {
  int64_t first = 6;  // the first few steps pay for allocations and warm-up
  int64_t last = 25;
  bool contains(int64_t step) const { return step >= first && step <= last; }
};

// Parses "FIRST-LAST" (e.g. "6-25"); throws InvalidArgument on anything else or on an empty window.
StepWindow parse_step_window(const std::string& text);

// kTraining: the step and what it holds. kAllReduce: lane 1 + bucket index, one per gradient bucket.
enum class SpanKind { kStep, kForward, kBackward, kAllReduceWait, kOptimizer, kAllReduce };
const char* to_string(SpanKind kind);

struct Span {
  SpanKind kind = SpanKind::kStep;
  int64_t step = 0;
  int64_t bucket = -1;  // kAllReduce only
  int64_t begin_us = 0;
  int64_t end_us = 0;
};

class Timeline {
 public:
  explicit Timeline(StepWindow window);

  // Times are measured from `origin`; every rank should pass the moment a collective returned (a barrier), so
  // that the ranks' lanes line up even across hosts. Defaults to the timeline's construction.
  void set_origin(TimelineClock::time_point origin);

  const StepWindow& window() const { return window_; }
  // Opens the step span; spans recorded until end_step() belong to `step`.
  void begin_step(int64_t step);
  void end_step();
  // The step now open, and whether it is in the window (instrumented code can skip reading clocks otherwise).
  int64_t current_step() const;
  bool recording() const;
  // Whether the window's last step has ended: the record is complete.
  bool finished() const;

  void add_span(SpanKind kind, int64_t step, TimelineClock::time_point begin, TimelineClock::time_point end,
                int64_t bucket = -1);

  std::vector<Span> spans() const;

 private:
  int64_t to_us(TimelineClock::time_point time) const;

  StepWindow window_;
  TimelineClock::time_point origin_;
  mutable std::mutex mutex_;
  std::vector<Span> spans_;
  int64_t step_ = 0;
  TimelineClock::time_point step_begin_;
  bool finished_ = false;
};

// A span on the training lane from construction to destruction, in the timeline's open step; does nothing when
// `timeline` is null or the step is outside the window.
class TimelineSpan {
 public:
  TimelineSpan(Timeline* timeline, SpanKind kind);
  ~TimelineSpan();
  TimelineSpan(const TimelineSpan&) = delete;
  TimelineSpan& operator=(const TimelineSpan&) = delete;

 private:
  Timeline* timeline_;
  SpanKind kind_;
  TimelineClock::time_point begin_;
};

}  // namespace tandem::monitor
