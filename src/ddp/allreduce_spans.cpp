#include "tandem/ddp/allreduce_spans.h"

#include <algorithm>

namespace tandem::ddp {

void AllReduceSpans::resize(size_t bucket_count) {
  spans_.clear();
  spans_.resize(bucket_count);
}

void AllReduceSpans::launching(size_t index) { spans_[index].launched_at = monitor::TimelineClock::now(); }

void AllReduceSpans::launched(size_t index, comm::Work& work) {
  auto completed_at = std::make_shared<std::atomic<monitor::TimelineClock::rep>>(0);
  spans_[index].completed_at = completed_at;
  work.observe_completion(
      [completed_at] { completed_at->store(monitor::TimelineClock::now().time_since_epoch().count()); });
}

// A backend thread may not yet have reported the completion it is about to report, and then the wait's end
// stands in for it.
void AllReduceSpans::record(monitor::TimelineClock::time_point wait_begin) {
  const auto wait_end = monitor::TimelineClock::now();
  const int64_t step = timeline_->current_step();
  timeline_->add_span(monitor::SpanKind::kAllReduceWait, step, wait_begin, wait_end);
  for (size_t b = 0; b < spans_.size(); ++b) {
    Span& span = spans_[b];
    if (!span.completed_at) continue;  // launched before the step was recorded
    const auto reported = span.completed_at->load();
    const auto completed =
        reported != 0 ? monitor::TimelineClock::time_point(monitor::TimelineClock::duration(reported)) : wait_end;
    timeline_->add_span(monitor::SpanKind::kAllReduce, step, span.launched_at, std::min(completed, wait_end),
                        static_cast<int64_t>(b));
    span.completed_at.reset();
  }
}

void AllReduceSpans::reset() {
  for (auto& span : spans_) span.completed_at.reset();
}

}  // namespace tandem::ddp
