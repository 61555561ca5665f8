#pragma once
// A training run's timeline (LoopOptions::timeline_path, docs/monitoring.md): set up on every rank before the
// first step, filled by the loop (the training lane) and the reducer (the all-reduce lanes), and written by rank
// 0, as a Chrome trace plus RUN_DIR/timeline_summary.json, once the window's last step or the run has ended.
#include <cstdint>
#include <string>

#include "tandem/comm/communicator.h"
#include "tandem/ddp/reducer.h"
#include "tandem/monitor/timeline.h"

namespace tandem::train {

class RunTimeline {
 public:
  // Collective. Throws InvalidArgument on every rank when rank 0 cannot write trace_path's folder: found now
  // rather than after the window's steps. `communicator` null: a world of one; `reducer` null: no DDP (the
  // all-reduce lanes stay empty). Both must outlive this object.
  RunTimeline(std::string trace_path, monitor::StepWindow window, std::string run_dir,
              comm::Communicator* communicator, ddp::Reducer* reducer);

  // What the loop records its spans into.
  monitor::Timeline* timeline() { return &timeline_; }

  // Collective, after every step (`steps_done` counts them since the run's start): writes the record once the
  // window's last step has ended.
  void after_step(int64_t steps_done);
  // Collective, at the run's end: writes what was recorded if the window had not ended.
  void finish(int64_t steps_done);

 private:
  void write(int64_t steps_done);

  std::string trace_path_;
  std::string run_dir_;
  comm::Communicator* communicator_;
  ddp::Reducer* reducer_;
  monitor::Timeline timeline_;
  bool written_ = false;
};

}  // namespace tandem::train
