#include "chart_catalogue.h"

#include <fmt/format.h>

#include <algorithm>

namespace tandem::monitor::report {
namespace {

using nlohmann::json;

// The epochs' points stand out from the steps' line they sit on. A mean over the epoch joins its neighbours
// with a line; a value the epoch held throughout (its learning rate) is a point alone.
json epoch_series_style(bool joined) {
  return {{"drawPoints", true}, {"pointSize", 3}, {"strokeWidth", joined ? 2 : 0}};
}

// A quantity both files hold: each step's value, and each epoch's at the step that ended the epoch.
struct StepAndEpochChart {
  const char* id;
  const char* title;
  const char* ylabel;
  const char* caption;
  double StepRecord::*step_value;
  double EpochRecord::*epoch_value;
  const char* epoch_name;
  bool epoch_is_mean;
};

Chart step_and_epoch_chart(const RunRecords& records, const StepAndEpochChart& what) {
  Chart chart(what.id, what.title, "optimizer step", what.ylabel, what.caption);
  if (!records.steps.empty()) {
    const size_t steps = chart.add_series("per step");
    for (const StepRecord& step : records.steps) chart.add_point(steps, step.step, step.*what.step_value);
  }
  const size_t epochs = chart.add_series(what.epoch_name, epoch_series_style(what.epoch_is_mean));
  for (const EpochRecord& epoch : records.epochs) chart.add_point(epochs, epoch.step, epoch.*what.epoch_value);
  return chart;
}

const StepAndEpochChart kLossChart = {
    "loss", "Training loss", "loss",
    "per step: averaged over the ranks (steps.jsonl); epoch mean: at the step that ended the epoch (metrics.jsonl)",
    &StepRecord::loss, &EpochRecord::loss, "epoch mean", /*epoch_is_mean=*/true};
const StepAndEpochChart kLrChart = {
    "lr", "Learning rate", "learning rate", "per step (steps.jsonl); epoch: the rate it trained with (metrics.jsonl)",
    &StepRecord::lr, &EpochRecord::lr, "epoch", /*epoch_is_mean=*/false};
const StepAndEpochChart kThroughputChart = {
    "throughput", "Throughput, all ranks", "samples/s",
    "per step: the step's samples over its wall time (steps.jsonl); epoch mean: over the epoch's training time "
    "(metrics.jsonl)",
    &StepRecord::samples_per_second, &EpochRecord::samples_per_second, "epoch mean", /*epoch_is_mean=*/true};

Chart accuracy_chart(const RunRecords& records) {
  Chart chart("accuracy", "Test accuracy", "epoch", "accuracy (%)",
              "after each epoch, on the whole test set (metrics.jsonl); epochs count from 0");
  const size_t accuracy = chart.add_series("test accuracy", epoch_series_style(/*joined=*/true));
  for (const EpochRecord& epoch : records.epochs) {
    if (epoch.accuracy) chart.add_point(accuracy, epoch.epoch, 100 * *epoch.accuracy);
  }
  return chart;
}

// A rank much slower than the others (a straggler) shows as its own line above theirs.
Chart step_time_chart(const RunRecords& records) {
  Chart chart("step-time", "Step time per rank", "optimizer step", "milliseconds",
              "rank r: from the start of its step to the loss all-reduce (forward, backward, gradient all-reduce); "
              "whole step: rank 0's wall time (steps.jsonl)");
  std::vector<size_t> ranks;
  for (size_t rank = 0; rank < world_size(records); ++rank) {
    ranks.push_back(chart.add_series(fmt::format("rank {}", rank)));
  }
  const size_t whole = chart.add_series("whole step");
  for (const StepRecord& step : records.steps) {
    for (size_t rank = 0; rank < step.rank_seconds.size(); ++rank) {
      chart.add_point(ranks[rank], step.step, 1000 * step.rank_seconds[rank]);
    }
    chart.add_point(whole, step.step, 1000 * step.seconds);
  }
  return chart;
}

}  // namespace

std::vector<Chart> report_charts(const RunRecords& records, std::vector<std::string>& notes) {
  std::vector<Chart> charts;
  charts.push_back(step_and_epoch_chart(records, kLossChart));
  charts.push_back(accuracy_chart(records));
  if (charts.back().empty() && !records.epochs.empty()) notes.push_back("no test set: no accuracy chart");
  charts.push_back(step_and_epoch_chart(records, kLrChart));
  charts.push_back(step_and_epoch_chart(records, kThroughputChart));
  charts.push_back(step_time_chart(records));
  if (records.epochs.empty()) notes.push_back("metrics.jsonl holds no finished epoch yet");
  charts.erase(std::remove_if(charts.begin(), charts.end(), [](const Chart& chart) { return chart.empty(); }),
               charts.end());
  return charts;
}

size_t world_size(const RunRecords& records) {
  size_t ranks = records.timeline ? records.timeline->ranks.size() : 0;
  for (const StepRecord& step : records.steps) ranks = std::max(ranks, step.rank_seconds.size());
  return ranks;
}

}  // namespace tandem::monitor::report
