// The timeline's record and its arithmetic: which spans a window keeps, how much all-reduce time counts as
// hidden behind backward, and the Chrome trace's shape.
#include "tandem/monitor/timeline.h"

#include <gtest/gtest.h>

#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "tandem/monitor/timeline_trace.h"
#include "tandem/util/error.h"

namespace tandem::monitor {
namespace {

Span span(SpanKind kind, int64_t step, int64_t begin, int64_t end, int64_t bucket = -1) {
  return {kind, step, bucket, begin, end};
}

TEST(StepWindow, ParsesFirstDashLastAndRefusesAnythingElse) {
  const StepWindow window = parse_step_window("3-7");
  EXPECT_EQ(window.first, 3);
  EXPECT_EQ(window.last, 7);
  EXPECT_TRUE(window.contains(3));
  EXPECT_TRUE(window.contains(7));
  EXPECT_FALSE(window.contains(8));
  for (const char* bad : {"", "7", "0-3", "5-4", "3-7x", "a-b", "-3-4"}) {
    EXPECT_THROW(parse_step_window(bad), InvalidArgument) << bad;
  }
}

TEST(Timeline, KeepsOnlyTheWindowsStepsAndSaysWhenItIsComplete) {
  Timeline timeline({2, 3});
  for (int64_t step = 1; step <= 4; ++step) {
    timeline.begin_step(step);
    EXPECT_EQ(timeline.recording(), step == 2 || step == 3) << step;
    { TimelineSpan forward(&timeline, SpanKind::kForward); }
    const auto now = TimelineClock::now();
    timeline.add_span(SpanKind::kAllReduce, step, now, now, 0);
    timeline.end_step();
    EXPECT_EQ(timeline.finished(), step >= 3) << step;
  }
  std::map<int64_t, int> spans_per_step;
  for (const Span& s : timeline.spans()) ++spans_per_step[s.step];
  EXPECT_EQ(spans_per_step, (std::map<int64_t, int>{{2, 3}, {3, 3}}));
  TimelineSpan nothing(nullptr, SpanKind::kOptimizer);  // a null timeline is allowed and records nothing
}

TEST(TimelineSummary, CountsOverlappingBucketsOnceAndHidesOnlyWhatRanBeforeTheWait) {
  // Step 1: backward 10..40 us, wait 30..40; bucket 0 runs 12..22, bucket 1 18..36 (overlapping): the
  // all-reduce covers 12..36 = 24 us, of which 12..30 = 18 us ran before the wait.
  // Step 2: nothing overlaps backward: bucket 0 runs entirely inside the wait.
  const std::vector<Span> spans = {
      span(SpanKind::kStep, 1, 0, 50),         span(SpanKind::kForward, 1, 0, 10),
      span(SpanKind::kBackward, 1, 10, 40),    span(SpanKind::kAllReduceWait, 1, 30, 40),
      span(SpanKind::kOptimizer, 1, 40, 50),   span(SpanKind::kAllReduce, 1, 12, 22, 0),
      span(SpanKind::kAllReduce, 1, 18, 36, 1),
      span(SpanKind::kStep, 2, 100, 150),      span(SpanKind::kForward, 2, 100, 110),
      span(SpanKind::kBackward, 2, 110, 140),  span(SpanKind::kAllReduceWait, 2, 130, 140),
      span(SpanKind::kOptimizer, 2, 140, 150), span(SpanKind::kAllReduce, 2, 130, 136, 0),
  };
  const RankTimelineSummary summary = summarize_timeline(spans, 1);
  EXPECT_EQ(summary.rank, 1);
  EXPECT_EQ(summary.steps, 2);
  EXPECT_DOUBLE_EQ(summary.step_ms, 0.050);
  EXPECT_DOUBLE_EQ(summary.forward_ms, 0.010);
  EXPECT_DOUBLE_EQ(summary.backward_ms, 0.030);
  EXPECT_DOUBLE_EQ(summary.wait_ms, 0.010);
  EXPECT_DOUBLE_EQ(summary.allreduce_ms, (24 + 6) / 2 / 1000.0);
  EXPECT_DOUBLE_EQ(summary.allreduce_hidden_ms, 18 / 2 / 1000.0);
  EXPECT_DOUBLE_EQ(summary.hidden_share(), 18.0 / 30.0);
}

TEST(TimelineSummary, IsEmptyWithoutSteps) {
  const RankTimelineSummary summary = summarize_timeline({}, 0);
  EXPECT_EQ(summary.steps, 0);
  EXPECT_EQ(summary.hidden_share(), 0);
}

TEST(ChromeTrace, HasAProcessPerRankAndALanePerBucket) {
  const std::vector<std::vector<Span>> spans = {
      {span(SpanKind::kStep, 1, 0, 50), span(SpanKind::kAllReduce, 1, 12, 22, 1)},
      {span(SpanKind::kStep, 1, 1, 51)},
  };
  const nlohmann::json trace = nlohmann::json::parse(chrome_trace_json(spans));
  std::set<std::pair<int, int>> lanes;
  std::vector<std::string> complete;
  for (const auto& event : trace.at("traceEvents")) {
    if (event.at("ph") == "M" && event.at("name") == "thread_name") {
      lanes.insert({event.at("pid").get<int>(), event.at("tid").get<int>()});
    }
    if (event.at("ph") == "X") complete.push_back(event.at("name").get<std::string>() + "@" + std::to_string(event.at("pid").get<int>()));
  }
  EXPECT_EQ(lanes, (std::set<std::pair<int, int>>{{0, 0}, {0, 1}, {0, 2}, {1, 0}}));
  EXPECT_EQ(complete, (std::vector<std::string>{"step 1@0", "all-reduce bucket 1@0", "step 1@1"}));
}

}  // namespace
}  // namespace tandem::monitor
