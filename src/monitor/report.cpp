#include "tandem/monitor/report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "report/chart_catalogue.h"
#include "report/html_escape.h"
#include "report/page_assets.h"
#include "tandem/config.h"
#include "tandem/monitor/dygraphs_bundle.h"
#include "tandem/util/atomic_file.h"
#include "tandem/util/error.h"

namespace tandem::monitor {
namespace {

using nlohmann::json;
using report::html_escape;

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
  if (const size_t ranks = report::world_size(records)) items.emplace_back("ranks", std::to_string(ranks));
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
  const std::vector<report::Chart> charts = report::report_charts(records, notes);
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
  for (const report::Chart& chart : charts) {
    html += fmt::format("<figure><div id=\"{0}\" class=\"chart\"></div><div id=\"{0}-legend\" class=\"legend\"></div>"
                        "<figcaption>{1}</figcaption></figure>\n",
                        chart.id(), html_escape(chart.caption()));
    specs.push_back(chart.spec());
  }
  html += "</section>\n";
  if (records.timeline) html += timeline_html(*records.timeline);
  html += fmt::format("<script type=\"application/json\" id=\"run-data\">{}</script>\n",
                      report::json_for_script({{"charts", specs}}));
  html += fmt::format("<script>\n{}</script>\n</body>\n</html>\n", report::page_script());
  return html;
}

namespace {

// The page replaces html_path whole: in the run dir, anything but its own report.html is the run's (a checkpoint,
// metrics.jsonl, weights), which nothing would bring back. The parent folders are resolved, the name itself is
// not: a link in the output's place is replaced as a link, never written through.
void require_not_a_run_file(const std::string& run_dir, const std::string& html_path) {
  namespace fs = std::filesystem;
  std::error_code error;
  const fs::path output = fs::absolute(html_path, error);
  const fs::path resolved = fs::weakly_canonical(output.parent_path(), error) / output.filename();
  const fs::path run = fs::weakly_canonical(run_dir, error);
  if (error || !fs::exists(fs::symlink_status(resolved))) return;
  const fs::path inside = resolved.lexically_relative(run);
  const bool in_run_dir = !inside.empty() && *inside.begin() != ".." && inside != ".";
  if (!in_run_dir || inside == "report.html") return;
  throw InvalidArgument(fmt::format("{} is the run's own file {} (in {}): the report would replace it; write the "
                                    "report to a file outside the run dir, or to its report.html",
                                    html_path, inside.string(), run_dir));
}

}  // namespace

void write_report(const std::string& run_dir, const std::string& html_path) {
  // A file is the likelier mistake for a run directory (its metrics.jsonl, or an old report.html): say so, where
  // read_run_records would say only that no run directory is there.
  if (std::filesystem::is_regular_file(run_dir)) {
    throw InvalidArgument(fmt::format("{} is a file, not a run directory: give the folder tandem train wrote "
                                      "(`run_dir`, or one under runs/)",
                                      run_dir));
  }
  require_not_a_run_file(run_dir, html_path);
  write_file_atomically(html_path, render_report(read_run_records(run_dir)));
}

}  // namespace tandem::monitor
