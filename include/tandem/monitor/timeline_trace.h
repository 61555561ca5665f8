#pragma once
// What a finished Timeline turns into: a Chrome trace of every rank (JSON, for Perfetto and chrome://tracing)
// and each rank's means per step, among them how much of the gradient all-reduce hid behind backward.
//
// Hidden communication: per step, the time covered by at least one bucket's all-reduce (overlapping buckets
// count once) is the communication time; the part of it that falls between the start of backward and the
// start of the wait at its end ran while backward still computed, hidden. The rest is exposed: the step waited
// for it.
#include <cstdint>
#include <string>
#include <vector>

#include "tandem/comm/communicator.h"
#include "tandem/monitor/timeline.h"
#include "tandem/monitor/timeline_summary.h"

namespace tandem::monitor {

RankTimelineSummary summarize_timeline(const std::vector<Span>& spans, int rank);

// Collective (`communicator` null: a world of one): every rank's spans, indexed by rank, on rank 0; empty on
// the other ranks.
std::vector<std::vector<Span>> gather_timelines(comm::Communicator* communicator, const Timeline& timeline);

// The Chrome trace of `spans_per_rank`: a process per rank, a thread per lane (the training lane, then one per
// bucket), complete events ("ph":"X") in microseconds.
std::string chrome_trace_json(const std::vector<std::vector<Span>>& spans_per_rank);

}  // namespace tandem::monitor
