#include "tandem/monitor/timeline_trace.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <utility>

#include "tandem/comm/value_collectives.h"
#include "tandem/util/error.h"

namespace tandem::monitor {
namespace {

using Interval = std::pair<int64_t, int64_t>;

// The total length covered by `intervals` clipped to [from, to].
int64_t covered_length(std::vector<Interval> intervals, int64_t from, int64_t to) {
  std::sort(intervals.begin(), intervals.end());
  int64_t total = 0, reached = from;
  for (auto [begin, end] : intervals) {
    begin = std::max(begin, reached);
    end = std::min(end, to);
    if (end > begin) {
      total += end - begin;
      reached = end;
    }
  }
  return total;
}

// One line per span, "kind step bucket begin end": what crosses the wire to rank 0.
std::string encode_spans(const std::vector<Span>& spans) {
  std::string text;
  for (const Span& span : spans) {
    text += fmt::format("{} {} {} {} {}\n", static_cast<int>(span.kind), span.step, span.bucket, span.begin_us,
                        span.end_us);
  }
  return text;
}

std::vector<Span> decode_spans(const std::string& text) {
  std::vector<Span> spans;
  std::istringstream lines(text);
  int kind = 0;
  Span span;
  while (lines >> kind >> span.step >> span.bucket >> span.begin_us >> span.end_us) {
    span.kind = static_cast<SpanKind>(kind);
    spans.push_back(span);
  }
  return spans;
}

}  // namespace

RankTimelineSummary summarize_timeline(const std::vector<Span>& spans, int rank) {
  struct StepSpans {
    std::map<SpanKind, Interval> training;
    std::vector<Interval> allreduces;
  };
  std::map<int64_t, StepSpans> steps;
  for (const Span& span : spans) {
    if (span.kind == SpanKind::kAllReduce) {
      steps[span.step].allreduces.push_back({span.begin_us, span.end_us});
    } else {
      steps[span.step].training[span.kind] = {span.begin_us, span.end_us};
    }
  }
  RankTimelineSummary summary;
  summary.rank = rank;
  const auto length = [](const StepSpans& step, SpanKind kind) -> double {
    auto found = step.training.find(kind);
    return found == step.training.end() ? 0.0 : static_cast<double>(found->second.second - found->second.first);
  };
  for (const auto& [number, step] : steps) {
    if (!step.training.count(SpanKind::kStep)) continue;  // a step the window cut
    ++summary.steps;
    summary.step_ms += length(step, SpanKind::kStep);
    summary.forward_ms += length(step, SpanKind::kForward);
    summary.backward_ms += length(step, SpanKind::kBackward);
    summary.wait_ms += length(step, SpanKind::kAllReduceWait);
    summary.optimizer_ms += length(step, SpanKind::kOptimizer);
    summary.allreduce_ms += static_cast<double>(covered_length(step.allreduces, std::numeric_limits<int64_t>::min(),
                                                               std::numeric_limits<int64_t>::max()));
    auto backward = step.training.find(SpanKind::kBackward);
    auto wait = step.training.find(SpanKind::kAllReduceWait);
    if (backward != step.training.end()) {
      const int64_t computing_until = wait != step.training.end() ? wait->second.first : backward->second.second;
      summary.allreduce_hidden_ms +=
          static_cast<double>(covered_length(step.allreduces, backward->second.first, computing_until));
    }
  }
  if (summary.steps > 0) {
    for (double* total : {&summary.step_ms, &summary.forward_ms, &summary.backward_ms, &summary.allreduce_ms,
                          &summary.allreduce_hidden_ms, &summary.wait_ms, &summary.optimizer_ms}) {
      *total /= 1000.0 * static_cast<double>(summary.steps);
    }
  }
  return summary;
}

std::vector<std::vector<Span>> gather_timelines(comm::Communicator* communicator, const Timeline& timeline) {
  const std::string mine = encode_spans(timeline.spans());
  if (!communicator || communicator->world_size() == 1) return {decode_spans(mine)};
  torch::Tensor longest = torch::tensor({static_cast<int64_t>(mine.size())});
  comm::all_reduce_values(*communicator, longest, comm::ReduceOp::Max);
  const std::vector<std::string> all =
      comm::all_gather_strings(*communicator, mine, static_cast<size_t>(longest.item<int64_t>()));
  if (communicator->rank() != 0) return {};
  std::vector<std::vector<Span>> spans_per_rank;
  for (const std::string& text : all) spans_per_rank.push_back(decode_spans(text));
  return spans_per_rank;
}

std::string chrome_trace_json(const std::vector<std::vector<Span>>& spans_per_rank) {
  nlohmann::json events = nlohmann::json::array();
  const auto name_lane = [&](int rank, int64_t lane, const std::string& name) {
    events.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", rank}, {"tid", lane}, {"args", {{"name", name}}}});
    events.push_back({{"ph", "M"}, {"name", "thread_sort_index"}, {"pid", rank}, {"tid", lane},
                      {"args", {{"sort_index", lane}}}});
  };
  for (size_t rank = 0; rank < spans_per_rank.size(); ++rank) {
    const int pid = static_cast<int>(rank);
    events.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", pid}, {"args", {{"name", fmt::format("rank {}", rank)}}}});
    events.push_back({{"ph", "M"}, {"name", "process_sort_index"}, {"pid", pid}, {"args", {{"sort_index", pid}}}});
    name_lane(pid, 0, "training");
    int64_t buckets = 0;
    for (const Span& span : spans_per_rank[rank]) buckets = std::max(buckets, span.bucket + 1);
    for (int64_t bucket = 0; bucket < buckets; ++bucket) {
      name_lane(pid, 1 + bucket, fmt::format("all-reduce bucket {}", bucket));
    }
    for (const Span& span : spans_per_rank[rank]) {
      const bool allreduce = span.kind == SpanKind::kAllReduce;
      std::string name = span.kind == SpanKind::kStep ? fmt::format("step {}", span.step)
                         : allreduce                   ? fmt::format("all-reduce bucket {}", span.bucket)
                                                       : to_string(span.kind);
      nlohmann::json event = {{"ph", "X"},
                              {"name", std::move(name)},
                              {"cat", allreduce ? "communication" : "training"},
                              {"pid", pid},
                              {"tid", allreduce ? 1 + span.bucket : 0},
                              {"ts", span.begin_us},
                              {"dur", std::max<int64_t>(0, span.end_us - span.begin_us)},
                              {"args", {{"step", span.step}}}};
      if (allreduce) event["args"]["bucket"] = span.bucket;
      events.push_back(std::move(event));
    }
  }
  return nlohmann::json{{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}}.dump();
}

}  // namespace tandem::monitor
