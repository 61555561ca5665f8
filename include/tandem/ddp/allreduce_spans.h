#pragma once
// What the reducer records into a monitor::Timeline (docs/monitoring.md), in its open step: each bucket's
// all-reduce, from its launch to its completion, and the wait for all of them at the end of backward.
//
// Part of the Reducer (reducer.h), which calls it with its mutex held; only a completion time is written on
// the backend's thread.
#include <atomic>
#include <cstddef>
#include <memory>
#include <vector>

#include "tandem/comm/communicator.h"
#include "tandem/monitor/timeline.h"

namespace tandem::ddp {

class AllReduceSpans {
 public:
  // Null: none. The timeline must outlive its use.
  void set_timeline(monitor::Timeline* timeline) { timeline_ = timeline; }
  // Whether the timeline records the current step.
  bool recording() const { return timeline_ && timeline_->recording(); }
  // One per bucket, whenever the buckets are formed anew.
  void resize(size_t bucket_count);

  // Around bucket `index`'s launch, in a recorded step.
  void launching(size_t index);
  void launched(size_t index, comm::Work& work);
  // Every bucket has completed, the wait for them began at `wait_begin`: adds the spans to the recorded step.
  void record(monitor::TimelineClock::time_point wait_begin);
  // Forgets the completions observed in this iteration.
  void reset();

 private:
  struct Span {
    monitor::TimelineClock::time_point launched_at;
    // In TimelineClock ticks, written on the backend's thread; 0 until then.
    std::shared_ptr<std::atomic<monitor::TimelineClock::rep>> completed_at;
  };
  monitor::Timeline* timeline_ = nullptr;
  std::vector<Span> spans_;
};

}  // namespace tandem::ddp
