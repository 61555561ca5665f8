#pragma once
// A timeline's means per step and rank: what RUN_DIR/timeline_summary.json holds (docs/monitoring.md), written
// by the training loop at the end of the timeline's window and read back by the report.
#include <cstdint>
#include <string>
#include <vector>

namespace tandem::monitor {

struct RankTimelineSummary {
  int rank = 0;
  int64_t steps = 0;  // steps recorded in the window
  // Means per step, in milliseconds.
  double step_ms = 0;
  double forward_ms = 0;
  double backward_ms = 0;  // the wait at its end included
  double allreduce_ms = 0;
  double allreduce_hidden_ms = 0;  // the part of allreduce_ms that ran while backward still computed
  double wait_ms = 0;              // the wait for the all-reduces at the end of backward
  double optimizer_ms = 0;
  double hidden_share() const { return allreduce_ms > 0 ? allreduce_hidden_ms / allreduce_ms : 0; }
};

struct TimelineSummary {
  std::string trace;  // the Chrome trace file of the same spans
  int64_t first_step = 0;
  int64_t last_step = 0;
  int world_size = 0;
  std::vector<RankTimelineSummary> ranks;
};

// timeline_summary.json's text; each rank's object also carries hidden_share, for readers other than tandem.
std::string to_json(const TimelineSummary& summary);

}  // namespace tandem::monitor
