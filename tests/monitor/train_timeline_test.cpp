// `tandem train --timeline` on two real ranks: the trace is JSON that Perfetto and chrome://tracing read, and for
// each rank and recorded step it holds the step's span with, inside it, one all-reduce span per gradient bucket.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "support/processes.h"
#include "support/tiny_datasets.h"
#include "tandem/ddp/bucket.h"
#include "tandem/ddp/ddp_options.h"
#include "tandem/nn/model_registry.h"

namespace tandem::testing {
namespace {

// How many buckets DDP forms for `tandem train`'s default model: the default caps, or one bucket where 2 ranks of
// 1 thread take every core (BucketPlan::kAdaptToHost).
size_t expected_bucket_count() {
  torch::nn::AnyModule model = nn::make_model("cnn", nn::ModelOptions{}).module;
  std::vector<torch::Tensor> trainable;
  for (const auto& parameter : model.ptr()->parameters()) trainable.push_back(parameter);
  if (ddp::ranks_fill_cores(2, 1, ddp::usable_cores())) return 1;
  const ddp::DdpOptions defaults;
  constexpr double kBytesPerMb = 1024.0 * 1024.0;
  return ddp::assign_buckets(trainable, static_cast<int64_t>(defaults.first_bucket_cap_mb * kBytesPerMb),
                             static_cast<int64_t>(defaults.bucket_cap_mb * kBytesPerMb))
      .size();
}

TEST(TrainTimeline, HoldsOneAllReduceSpanPerBucketInsideEachRecordedStepOfEachRank) {
  const std::string dir = make_temp_dir("train_timeline");
  const std::string trace_path = dir + "/trace.json";
  const std::string run_dir = dir + "/run";
  const ProcessResult result = run_process(
      {tandem_cli(), "run", "--nproc-per-node", "2", "--", tandem_cli(), "train", "--data",
       write_tiny_mnist("timeline_data", 160, 20), "--epochs", "1", "--batch-size", "16", "--threads", "1",
       "--timeout", "60", "--run-dir", run_dir, "--timeline", trace_path, "--timeline-steps", "2-4"},
      {}, std::chrono::seconds(180));
  ASSERT_FALSE(result.timed_out) << result.output;
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("timeline of steps 2-4 written to " + trace_path), std::string::npos) << result.output;

  std::ifstream file(trace_path);
  ASSERT_TRUE(file.good()) << "no trace at " << trace_path;
  const nlohmann::json trace = nlohmann::json::parse(file);  // throws, failing the test, if it is not JSON
  const size_t buckets = expected_bucket_count();
  ASSERT_GE(buckets, 1u);

  struct Interval {
    int64_t begin = 0, end = 0;
  };
  std::map<std::pair<int, int64_t>, std::vector<Interval>> step_spans;                 // (rank, step)
  std::map<std::tuple<int, int64_t, int64_t>, std::vector<Interval>> allreduce_spans;  // (rank, step, bucket)
  for (const auto& event : trace.at("traceEvents")) {
    if (event.at("ph") != "X") continue;
    const int rank = event.at("pid");
    const int64_t step = event.at("args").at("step");
    const Interval interval{event.at("ts").get<int64_t>(), event.at("ts").get<int64_t>() + event.at("dur").get<int64_t>()};
    const std::string name = event.at("name");
    if (name == "step " + std::to_string(step)) step_spans[{rank, step}].push_back(interval);
    if (event.at("cat") == "communication") {
      allreduce_spans[{rank, step, event.at("args").at("bucket").get<int64_t>()}].push_back(interval);
    }
  }
  for (int rank = 0; rank < 2; ++rank) {
    for (int64_t step = 2; step <= 4; ++step) {
      const auto& steps = step_spans[std::make_pair(rank, step)];
      ASSERT_EQ(steps.size(), 1u) << "rank " << rank << " step " << step;
      const Interval whole = steps[0];
      for (int64_t bucket = 0; bucket < static_cast<int64_t>(buckets); ++bucket) {
        const auto& spans = allreduce_spans[std::make_tuple(rank, step, bucket)];
        ASSERT_EQ(spans.size(), 1u) << "rank " << rank << " step " << step << " bucket " << bucket;
        EXPECT_LE(whole.begin, spans[0].begin) << "rank " << rank << " step " << step << " bucket " << bucket;
        EXPECT_LE(spans[0].begin, spans[0].end);
        EXPECT_LE(spans[0].end, whole.end) << "rank " << rank << " step " << step << " bucket " << bucket;
      }
    }
  }
  EXPECT_EQ(allreduce_spans.size(), 2 * 3 * buckets) << "spans outside the window's steps 2-4";

  std::ifstream summary_file(run_dir + "/timeline_summary.json");
  ASSERT_TRUE(summary_file.good());
  const nlohmann::json summary = nlohmann::json::parse(summary_file);
  ASSERT_EQ(summary.at("ranks").size(), 2u);
  for (const auto& rank : summary.at("ranks")) {
    EXPECT_EQ(rank.at("steps"), 3);
    EXPECT_GE(rank.at("hidden_share").get<double>(), 0.0);
    EXPECT_LE(rank.at("hidden_share").get<double>(), 1.0);
    EXPECT_GT(rank.at("allreduce_ms").get<double>(), 0.0);
  }
}

TEST(TrainTimeline, AnUnwritableTraceFileFailsTheRunWithOneLineNamingIt) {
  const std::string dir = make_temp_dir("train_timeline_unwritable");
  const ProcessResult result = run_process(
      {tandem_cli(), "train", "--data", write_tiny_mnist("timeline_unwritable", 64, 8), "--epochs", "1",
       "--batch-size", "16", "--threads", "1", "--run-dir", dir + "/run", "--timeline", dir + "/missing/trace.json",
       "--timeline-steps", "1-2"},
      {}, std::chrono::seconds(120));
  ASSERT_FALSE(result.timed_out) << result.output;
  EXPECT_NE(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find(dir + "/missing/trace.json"), std::string::npos) << result.output;
}

TEST(TrainTimeline, ABadStepWindowIsAOneLineError) {
  const ProcessResult result =
      run_process({tandem_cli(), "train", "--timeline", "/tmp/t.json", "--timeline-steps", "9-3"}, {},
                  std::chrono::seconds(60));
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find("FIRST-LAST"), std::string::npos) << result.output;
}

}  // namespace
}  // namespace tandem::testing
