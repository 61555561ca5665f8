#include "tandem/monitor/report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>

#include "report/page_assets.h"
#include "tandem/config.h"
#include "tandem/monitor/dygraphs_bundle.h"
#include "tandem/util/atomic_file.h"
#include "tandem/util/error.h"

namespace tandem::monitor {
namespace {

using nlohmann::json;

constexpr double kNoValue = std::numeric_limits<double>::quiet_NaN();

// One dygraphs chart. dygraphs takes one row per x value with a column per series, so the rows are the union
// of the series' x values, in order, with NaN (written as null: no point) where a series has none.
class Chart {
 public:
  // `caption` says where the points come from, under the chart.
  Chart(std::string id, std::string title, std::string xlabel, std::string ylabel, std::string caption)
      : id_(std::move(id)),
        title_(std::move(title)),
        xlabel_(std::move(xlabel)),
        ylabel_(std::move(ylabel)),
        caption_(std::move(caption)) {}

  // Returns the series' column for add_point. `options` are dygraphs' per-series options.
  size_t add_series(const std::string& name, json options = json::object()) {
    names_.push_back(name);
    if (!options.empty()) series_options_[name] = std::move(options);
    return names_.size() - 1;
  }
  void add_point(size_t series, int64_t x, double y) {
    std::vector<double>& row = rows_[x];
    row.resize(std::max(row.size(), names_.size()), kNoValue);
    row[series] = y;
  }

  const std::string& id() const { return id_; }
  const std::string& caption() const { return caption_; }
  bool empty() const { return rows_.empty(); }

  // What the page's script hands to dygraphs.
  json spec() const {
    json rows = json::array();
    for (const auto& [x, values] : rows_) {
      json row = {x};
      for (size_t series = 0; series < names_.size(); ++series) {
        const double value = series < values.size() ? values[series] : kNoValue;
        row.push_back(std::isfinite(value) ? json(value) : json(nullptr));
      }
      rows.push_back(std::move(row));
    }
    json labels = {xlabel_};
    for (const std::string& name : names_) labels.push_back(name);
    return {{"id", id_},       {"title", title_}, {"xlabel", xlabel_},          {"ylabel", ylabel_},
            {"labels", labels}, {"rows", rows},    {"series", series_options_}};
  }

 private:
  std::string id_, title_, xlabel_, ylabel_, caption_;
  std::vector<std::string> names_;
  json series_options_ = json::object();
  std::map<int64_t, std::vector<double>> rows_;
};

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

size_t world_size(const RunRecords& records) {
  size_t ranks = records.timeline ? records.timeline->ranks.size() : 0;
  for (const StepRecord& step : records.steps) ranks = std::max(ranks, step.rank_seconds.size());
  return ranks;
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

// Every chart the records can fill, in the page's order; a note for each one they cannot.
std::vector<Chart> build_charts(const RunRecords& records, std::vector<std::string>& notes) {
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

std::string html_escape(const std::string& text) {
  std::string escaped;
  for (const char c : text) {
    switch (c) {
      case '&': escaped += "&amp;"; break;
      case '<': escaped += "&lt;"; break;
      case '>': escaped += "&gt;"; break;
      case '"': escaped += "&quot;"; break;
      case '\'': escaped += "&#39;"; break;
      default: escaped += c;
    }
  }
  return escaped;
}

// JSON to sit inside <script type="application/json">: only "</script" or "<!--" could end or change that
// element early, and both need a '<', which JSON holds only inside strings, where \u003c means the same.
std::string json_for_script(const json& value) {
  const std::string text = value.dump(-1, ' ', /*ensure_ascii=*/true, json::error_handler_t::replace);
  std::string escaped;
  for (const char c : text) escaped += c == '<' ? std::string("\\u003c") : std::string(1, c);
  return escaped;
}

std::string run_name(const std::string& run_dir) {
  std::filesystem::path path = std::filesystem::absolute(run_dir).lexically_normal();
  if (path.filename().empty()) path = path.parent_path();
  return path.filename().string();
}

std::string number_text(double value) { return std::isfinite(value) ? fmt::format("{:.4g}", value) : "n/a"; }

std::string summary_html(const RunRecords& records) {
  std::vector<std::pair<std::string, std::string>> items;
  items.emplace_back("epochs", std::to_string(records.epochs.size()));
  const int64_t steps = std::max(records.steps.empty() ? 0 : records.steps.back().step,
                                 records.epochs.empty() ? 0 : records.epochs.back().step);
  items.emplace_back("optimizer steps", std::to_string(steps));
  if (const size_t ranks = world_size(records)) items.emplace_back("ranks", std::to_string(ranks));
  if (!records.epochs.empty()) {
    const EpochRecord& last = records.epochs.back();
    items.emplace_back("final loss", number_text(last.loss));
    if (last.accuracy) items.emplace_back("final accuracy", number_text(100 * *last.accuracy) + " %");
    items.emplace_back("last epoch samples/s", number_text(last.samples_per_second));
    double seconds = 0;
    for (const EpochRecord& epoch : records.epochs) seconds += epoch.train_seconds;
    items.emplace_back("training time", number_text(seconds) + " s");
  }
  std::string html = "<dl class=\"summary\">\n";
  for (const auto& [name, value] : items) {
    html += fmt::format("<div><dt>{}</dt><dd>{}</dd></div>\n", html_escape(name), html_escape(value));
  }
  return html + "</dl>\n";
}

// A rank's step as bars in proportion: forward, backward until its wait, the all-reduce time it waited for at
// the end of backward, the optimizer and the rest. The all-reduce's hidden part runs during backward, so it adds
// no width.
std::string timeline_html(const TimelineSummary& timeline) {
  struct Phase {
    const char* name;
    double (*ms)(const RankTimelineSummary&);
  };
  const Phase phases[] = {
      {"forward", [](const RankTimelineSummary& r) { return r.forward_ms; }},
      {"backward", [](const RankTimelineSummary& r) { return r.backward_ms - r.wait_ms; }},
      {"waiting for all-reduce", [](const RankTimelineSummary& r) { return r.wait_ms; }},
      {"optimizer", [](const RankTimelineSummary& r) { return r.optimizer_ms; }}};
  double longest = 0;
  for (const RankTimelineSummary& rank : timeline.ranks) longest = std::max(longest, rank.step_ms);
  auto share = [longest](double ms) {
    return longest > 0 && std::isfinite(ms) ? std::max(0.0, 100 * ms / longest) : 0.0;
  };

  std::string html = "<section id=\"timeline\">\n<h2>Timeline</h2>\n";
  html += fmt::format("<p>Means per step over steps {} to {} on {} ranks, from <code>{}</code>.</p>\n",
                      timeline.first_step, timeline.last_step, timeline.world_size, html_escape(timeline.trace));
  html += "<div class=\"bars\">\n";
  for (const RankTimelineSummary& rank : timeline.ranks) {
    html += fmt::format("<div class=\"bar-row\"><span class=\"bar-label\">rank {}</span><div class=\"bar\">",
                        rank.rank);
    double drawn = 0;
    for (const Phase& phase : phases) {
      const double ms = phase.ms(rank);
      drawn += std::isfinite(ms) ? ms : 0;
      html += fmt::format("<span class=\"phase-{}\" style=\"width:{:.3f}%\" title=\"{} {} ms\"></span>",
                          &phase - phases, share(ms), phase.name, number_text(ms));
    }
    const double other = std::max(0.0, rank.step_ms - drawn);
    html += fmt::format("<span class=\"phase-other\" style=\"width:{:.3f}%\" title=\"other {} ms\"></span>",
                        share(other), number_text(other));
    html += fmt::format("</div><span class=\"bar-total\">{} ms</span></div>\n", number_text(rank.step_ms));
  }
  html += "<div class=\"bar-key\">";
  for (const Phase& phase : phases) {
    html += fmt::format("<span><i class=\"phase-{}\"></i>{}</span>", &phase - phases, phase.name);
  }
  html += "<span><i class=\"phase-other\"></i>other</span></div>\n</div>\n";

  html += fmt::format("<table id=\"timeline-table\" data-rows=\"{}\">\n<tr><th>rank</th><th>step ms</th>"
                      "<th>forward ms</th><th>backward ms (wait included)</th><th>all-reduce ms</th><th>hidden ms</th>"
                      "<th>waited ms</th><th>optimizer ms</th><th>hidden share</th></tr>\n",
                      timeline.ranks.size());
  for (const RankTimelineSummary& rank : timeline.ranks) {
    html += fmt::format("<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>"
                        "<td>{} %</td></tr>\n",
                        rank.rank, number_text(rank.step_ms), number_text(rank.forward_ms),
                        number_text(rank.backward_ms), number_text(rank.allreduce_ms),
                        number_text(rank.allreduce_hidden_ms), number_text(rank.wait_ms),
                        number_text(rank.optimizer_ms), number_text(100 * rank.hidden_share()));
  }
  return html + "</table>\n</section>\n";
}

struct DygraphsFiles {
  std::string_view script;
  std::string_view style;
};

#if TANDEM_HAVE_DYGRAPHS
// The embedded files end with a link to their source map, which the report does not carry.
std::string_view without_source_map(std::string_view text) {
  const size_t link = text.rfind("# sourceMappingURL=");
  return link == std::string_view::npos ? text : text.substr(0, text.rfind('\n', link) + 1);
}

DygraphsFiles dygraphs_files() { return {without_source_map(dygraphs_script()), without_source_map(dygraphs_style())}; }
#else
DygraphsFiles dygraphs_files() {
  throw UnsupportedError("this tandem was built without libjs-dygraphs: install it (apt-get install libjs-dygraphs) "
                         "and rebuild");
}
#endif

}  // namespace

std::string default_report_path(const std::string& run_dir) {
  return (std::filesystem::path(run_dir) / "report.html").string();
}

std::string render_report(const RunRecords& records) {
  const DygraphsFiles dygraphs = dygraphs_files();
  std::vector<std::string> notes = records.notes;
  const std::vector<Chart> charts = build_charts(records, notes);
  const std::string name = html_escape(run_name(records.run_dir));

  std::string html = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n";
  html += fmt::format("<title>tandem report: {}</title>\n", name);
  html += fmt::format("<style>\n{}\n</style>\n<style>\n{}</style>\n", dygraphs.style, report::page_style());
  html += fmt::format("<script>\n{}\n</script>\n</head>\n", dygraphs.script);
  html += fmt::format("<body data-charts-expected=\"{}\" data-charts-drawn=\"0\">\n", charts.size());
  html += fmt::format("<header>\n<h1>tandem report: {}</h1>\n<div class=\"run-dir\">{}</div>\n", name,
                      html_escape(records.run_dir));
  html += summary_html(records);
  if (!notes.empty()) {
    html += "<ul class=\"notes\">\n";
    for (const std::string& note : notes) html += "<li>" + html_escape(note) + "</li>\n";
    html += "</ul>\n";
  }
  html += "</header>\n<section class=\"charts\">\n";
  json specs = json::array();
  for (const Chart& chart : charts) {
    html += fmt::format("<figure><div id=\"{0}\" class=\"chart\"></div><div id=\"{0}-legend\" class=\"legend\"></div>"
                        "<figcaption>{1}</figcaption></figure>\n",
                        chart.id(), html_escape(chart.caption()));
    specs.push_back(chart.spec());
  }
  html += "</section>\n";
  if (records.timeline) html += timeline_html(*records.timeline);
  html += fmt::format("<script type=\"application/json\" id=\"run-data\">{}</script>\n",
                      json_for_script({{"charts", specs}}));
  html += fmt::format("<script>\n{}</script>\n</body>\n</html>\n", report::page_script());
  return html;
}

void write_report(const std::string& run_dir, const std::string& html_path) {
  write_file_atomically(html_path, render_report(read_run_records(run_dir)));
}

}  // namespace tandem::monitor
