#include "tandem/monitor/timeline.h"

#include <fmt/format.h>

#include <cstdio>

#include "tandem/util/error.h"

namespace tandem::monitor {

StepWindow parse_step_window(const std::string& text) {
  long long first = 0, last = 0;
  char end = 0;
  if (std::sscanf(text.c_str(), "%lld-%lld%c", &first, &last, &end) != 2 || first < 1 || last < first) {
    throw InvalidArgument(fmt::format("timeline steps must be FIRST-LAST with 1 <= FIRST <= LAST (e.g. 6-25), "
                                      "got '{}'", text));
  }
  return {first, last};
}

const char* to_string(SpanKind kind) {
  switch (kind) {
    case SpanKind::kStep:
      return "step";
    case SpanKind::kForward:
      return "forward";
    case SpanKind::kBackward:
      return "backward";
    case SpanKind::kAllReduceWait:
      return "wait for all-reduce";
    case SpanKind::kOptimizer:
      return "optimizer";
    case SpanKind::kAllReduce:
      return "all-reduce";
  }
  return "?";
}

Timeline::Timeline(StepWindow window) : window_(window), origin_(TimelineClock::now()) {}

void Timeline::set_origin(TimelineClock::time_point origin) {
  std::lock_guard<std::mutex> lock(mutex_);
  origin_ = origin;
}

void Timeline::begin_step(int64_t step) {
  std::lock_guard<std::mutex> lock(mutex_);
  step_ = step;
  step_begin_ = TimelineClock::now();
}

void Timeline::end_step() {
  const auto now = TimelineClock::now();
  std::lock_guard<std::mutex> lock(mutex_);
  if (window_.contains(step_)) spans_.push_back({SpanKind::kStep, step_, -1, to_us(step_begin_), to_us(now)});
  if (step_ >= window_.last) finished_ = true;
}

int64_t Timeline::current_step() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return step_;
}

bool Timeline::recording() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return window_.contains(step_);
}

bool Timeline::finished() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return finished_;
}

void Timeline::add_span(SpanKind kind, int64_t step, TimelineClock::time_point begin, TimelineClock::time_point end,
                        int64_t bucket) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (window_.contains(step)) spans_.push_back({kind, step, bucket, to_us(begin), to_us(end)});
}

std::vector<Span> Timeline::spans() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return spans_;
}

int64_t Timeline::to_us(TimelineClock::time_point time) const {
  return std::chrono::duration_cast<std::chrono::microseconds>(time - origin_).count();
}

TimelineSpan::TimelineSpan(Timeline* timeline, SpanKind kind)
    : timeline_(timeline && timeline->recording() ? timeline : nullptr), kind_(kind) {
  if (timeline_) begin_ = TimelineClock::now();
}

TimelineSpan::~TimelineSpan() {
  if (timeline_) timeline_->add_span(kind_, timeline_->current_step(), begin_, TimelineClock::now());
}

}  // namespace tandem::monitor
