// The run report (tandem/monitor/report.h), drawn by a real browser: Debian's chromium renders the page
// headless, the test reads back from the DOM which charts dygraphs drew and with how many rows, and checks
// that a screenshot of the page holds plotted lines. Reading the run's files is tested on its own first.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "support/processes.h"
#include "support/scratch_dir.h"
#include "tandem/config.h"
#include "tandem/data/image.h"
#include "tandem/monitor/report.h"
#include "tandem/monitor/run_records.h"
#include "tandem/util/error.h"

namespace tandem::monitor {
namespace {

using nlohmann::json;
using testing::ScratchDir;

constexpr int kEpochs = 3;
constexpr int kStepsPerEpoch = 20;
constexpr int kRanks = 2;
constexpr int kSteps = kEpochs * kStepsPerEpoch;

void write_text(const std::string& path, const std::string& text) {
  std::ofstream file(path, std::ios::trunc);
  file << text;
  ASSERT_TRUE(file.good()) << path;
}

std::string lines(const std::vector<json>& objects) {
  std::string text;
  for (const json& object : objects) text += object.dump() + "\n";
  return text;
}

// metrics.jsonl as tandem train writes it: one line per epoch, loss falling and accuracy rising.
std::vector<json> epoch_lines(int64_t total = 10000) {
  std::vector<json> epochs;
  for (int epoch = 0; epoch < kEpochs; ++epoch) {
    const double accuracy = 0.8 + 0.05 * epoch;
    epochs.push_back({{"epoch", epoch},
                      {"loss", 1.5 / (epoch + 1)},
                      {"accuracy", total > 0 ? accuracy : 0.0},
                      {"correct", static_cast<int64_t>(accuracy * total)},
                      {"total", total},
                      {"lr", 0.02 / (epoch + 1)},
                      {"samples_per_second", 4000 + 100 * epoch},
                      {"train_seconds", 0.7},
                      {"step", (epoch + 1) * kStepsPerEpoch}});
  }
  return epochs;
}

// steps.jsonl: one line per optimizer step of kRanks ranks, rank 1 the slower one.
std::vector<json> step_lines() {
  std::vector<json> steps;
  for (int step = 1; step <= kSteps; ++step) {
    const int epoch = (step - 1) / kStepsPerEpoch;
    const double rank0 = 0.030 + 0.002 * std::sin(step);
    const double rank1 = 0.036 + 0.003 * std::cos(step);
    steps.push_back({{"step", step},
                     {"epoch", epoch},
                     {"batch", (step - 1) % kStepsPerEpoch},
                     {"loss", 2.3 * std::exp(-step / 15.0) + 0.2},
                     {"lr", 0.02 / (epoch + 1)},
                     {"loss_scale", 1},
                     {"optimizer_stepped", true},
                     {"seconds", rank1 + 0.002},
                     {"samples_per_second", 128 / (rank1 + 0.002)},
                     {"rank_seconds", {rank0, rank1}}});
  }
  return steps;
}

json timeline_summary(const std::string& trace = "trace.json") {
  json ranks = json::array();
  for (int rank = 0; rank < kRanks; ++rank) {
    ranks.push_back({{"rank", rank},        {"step_ms", 31.2 + rank}, {"forward_ms", 8.1},
                     {"backward_ms", 17.0}, {"allreduce_ms", 9.3},    {"allreduce_hidden_ms", 6.0},
                     {"wait_ms", 3.3},      {"optimizer_ms", 1.2},    {"hidden_share", 0.645}});
  }
  return {{"trace", trace}, {"first_step", 6}, {"last_step", 25}, {"world_size", kRanks}, {"ranks", ranks}};
}

// Every file a run with --timeline leaves.
std::string write_full_run(const ScratchDir& scratch, const std::string& trace = "trace.json") {
  const std::string run_dir = scratch / "run";
  std::filesystem::create_directories(run_dir);
  write_text(run_dir + "/metrics.jsonl", lines(epoch_lines()));
  write_text(run_dir + "/steps.jsonl", lines(step_lines()));
  write_text(run_dir + "/timeline_summary.json", timeline_summary(trace).dump());
  return run_dir;
}

// ---- reading the run's files ----

TEST(RunRecords, ReadsEveryFileOfARun) {
  ScratchDir scratch;
  const RunRecords records = read_run_records(write_full_run(scratch));
  ASSERT_EQ(records.epochs.size(), size_t{kEpochs});
  ASSERT_EQ(records.steps.size(), size_t{kSteps});
  EXPECT_EQ(records.epochs.back().step, kSteps);
  EXPECT_DOUBLE_EQ(*records.epochs.back().accuracy, 0.9);
  EXPECT_EQ(records.steps.front().step, 1);
  EXPECT_EQ(records.steps.back().rank_seconds.size(), size_t{kRanks});
  ASSERT_TRUE(records.timeline.has_value());
  EXPECT_EQ(records.timeline->ranks.size(), size_t{kRanks});
  EXPECT_DOUBLE_EQ(records.timeline->ranks[1].step_ms, 32.2);
  EXPECT_TRUE(records.notes.empty());
}

// The message is one line naming the file, so `tandem report` prints it as it is.
void expect_invalid_naming(const std::string& run_dir, const std::string& expected) {
  try {
    read_run_records(run_dir);
    FAIL() << "read_run_records(" << run_dir << ") did not throw";
  } catch (const InvalidArgument& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find(expected), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
}

TEST(RunRecords, MissingMetricsIsInvalidArgumentNamingTheFile) {
  ScratchDir scratch;
  expect_invalid_naming(scratch.path(), scratch / "metrics.jsonl not found");
  expect_invalid_naming(scratch / "absent", "run directory " + (scratch / "absent") + " not found");
}

TEST(RunRecords, UnparsableLineIsInvalidArgumentNamingFileAndLine) {
  ScratchDir scratch;
  std::vector<json> epochs = epoch_lines();
  write_text(scratch / "metrics.jsonl", epochs[0].dump() + "\nnot json\n" + epochs[1].dump() + "\n");
  expect_invalid_naming(scratch.path(), scratch / "metrics.jsonl line 2");
  epochs[1]["loss"] = "low";
  write_text(scratch / "metrics.jsonl", lines(epochs));
  expect_invalid_naming(scratch.path(), "line 2: \"loss\" is not a number");
}

// A killed run stops in the middle of a line; what it finished is still worth a report.
TEST(RunRecords, TornLastLineIsLeftOutWithANote) {
  ScratchDir scratch;
  const std::string torn = R"({"epoch":3,"loss":0.2,"accu)";
  write_text(scratch / "metrics.jsonl", lines(epoch_lines()) + torn);
  write_text(scratch / "steps.jsonl", lines(step_lines()) + R"({"step":61,"epo)");
  const RunRecords records = read_run_records(scratch.path());
  EXPECT_EQ(records.epochs.size(), size_t{kEpochs});
  EXPECT_EQ(records.steps.size(), size_t{kSteps});
  ASSERT_EQ(records.notes.size(), 2u);
  EXPECT_NE(records.notes[0].find("metrics.jsonl: left out its torn last line 4"), std::string::npos);
  EXPECT_NE(records.notes[1].find("steps.jsonl: left out its torn last line 61"), std::string::npos);
}

// A resumed run trains again the steps after its checkpoint; the report shows the run it continued with.
TEST(RunRecords, RepeatedStepsKeepTheLaterLine) {
  ScratchDir scratch;
  std::vector<json> steps = step_lines();
  write_text(scratch / "metrics.jsonl", "");
  json again = steps[kSteps - 1];
  again["loss"] = 0.125;
  steps.push_back(again);
  write_text(scratch / "steps.jsonl", lines(steps));
  const RunRecords records = read_run_records(scratch.path());
  ASSERT_EQ(records.steps.size(), size_t{kSteps});
  EXPECT_EQ(records.steps.back().loss, 0.125);
  EXPECT_TRUE(records.epochs.empty());
}

TEST(RunRecords, RunWithoutTestSetHasNoAccuracy) {
  ScratchDir scratch;
  write_text(scratch / "metrics.jsonl", lines(epoch_lines(/*total=*/0)));
  const RunRecords records = read_run_records(scratch.path());
  ASSERT_EQ(records.epochs.size(), size_t{kEpochs});
  EXPECT_FALSE(records.epochs[0].accuracy.has_value());
  EXPECT_FALSE(records.timeline.has_value());
  ASSERT_EQ(records.notes.size(), 1u);
  EXPECT_NE(records.notes[0].find("steps.jsonl not found"), std::string::npos);
}

// ---- the page, in a browser ----

// Debian's chromium, found on PATH. Its absence fails the test rather than skipping it: CI installs it, and a
// report test that passes without ever drawing the page would prove nothing.
std::string chromium() {
  const char* path = std::getenv("PATH");
  std::stringstream folders(path ? path : "");
  for (std::string folder; std::getline(folders, folder, ':');) {
    const std::filesystem::path candidate = std::filesystem::path(folder) / "chromium";
    if (::access(candidate.c_str(), X_OK) == 0) return candidate.string();
  }
  return {};
}

// Runs headless chromium on `html_path` with `extra` arguments, its standard output into `stdout_path`
// (chromium logs on standard error, which must not mix into a DOM dump). Its profile lives in the scratch dir.
void run_chromium(const ScratchDir& scratch, const std::string& html_path, std::vector<std::string> extra,
                  const std::string& stdout_path) {
  const std::string browser = chromium();
  ASSERT_FALSE(browser.empty()) << "chromium not found on PATH: install chromium (scripts/install-deps)";
  std::vector<std::string> argv = {"/bin/sh", "-c", "out=$1; shift; exec \"$@\" > \"$out\"", "sh", stdout_path,
                                   browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                                   "--user-data-dir=" + (scratch / "chromium-profile"),
                                   // dygraphs draws synchronously, but give timers and layout time to settle.
                                   "--virtual-time-budget=5000"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  argv.push_back("file://" + std::filesystem::absolute(html_path).string());
  const testing::ProcessResult result = testing::run_process(argv, {}, std::chrono::seconds(90));
  ASSERT_FALSE(result.timed_out) << result.output;
  ASSERT_EQ(result.exit_code, 0) << result.output;
}

// The page's DOM after its scripts ran.
std::string rendered_dom(const ScratchDir& scratch, const std::string& html_path) {
  const std::string dom_path = scratch / "dom.html";
  run_chromium(scratch, html_path, {"--dump-dom"}, dom_path);
  std::ifstream file(dom_path);
  return std::string(std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>());
}

// The attributes of the start tag that carries id="id" (or of <body> for "body"); empty if there is none.
std::map<std::string, std::string> attributes(const std::string& dom, const std::string& id) {
  const size_t anchor = id == "body" ? dom.find("<body") : dom.find("id=\"" + id + "\"");
  if (anchor == std::string::npos) return {};
  const size_t begin = dom.rfind('<', anchor);
  const std::string tag = dom.substr(begin, dom.find('>', anchor) - begin);
  std::map<std::string, std::string> found;
  const std::regex attribute(R"(([\w-]+)="([^"]*)\")");
  for (auto match = std::sregex_iterator(tag.begin(), tag.end(), attribute); match != std::sregex_iterator(); ++match) {
    found[(*match)[1]] = (*match)[2];
  }
  return found;
}

struct ExpectedChart {
  std::string id;
  int rows;
  int series;
};

// Each chart's element says dygraphs drew it, with the rows and series the files hold, and holds its canvas.
void expect_drawn(const std::string& dom, const std::vector<ExpectedChart>& charts) {
  const auto body = attributes(dom, "body");
  EXPECT_EQ(body.count("data-charts-drawn") ? body.at("data-charts-drawn") : "", std::to_string(charts.size()));
  EXPECT_EQ(body.count("data-charts-expected") ? body.at("data-charts-expected") : "", std::to_string(charts.size()));
  for (const ExpectedChart& chart : charts) {
    SCOPED_TRACE("chart " + chart.id);
    auto found = attributes(dom, chart.id);
    ASSERT_FALSE(found.empty()) << "no element with id " << chart.id;
    EXPECT_EQ(found["data-drawn"], "1");
    EXPECT_EQ(found["data-rows"], std::to_string(chart.rows));
    EXPECT_EQ(found["data-series"], std::to_string(chart.series));
    EXPECT_EQ(found.count("data-error"), 0u) << found["data-error"];
    const size_t start = dom.find("id=\"" + chart.id + "\"");
    const size_t legend = dom.find("id=\"" + chart.id + "-legend\"", start);
    EXPECT_NE(dom.substr(start, legend - start).find("<canvas"), std::string::npos);
  }
}

class ReportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!TANDEM_HAVE_DYGRAPHS) GTEST_SKIP() << "built without libjs-dygraphs (see BuiltWithoutDygraphs)";
  }
};

TEST_F(ReportTest, BrowserDrawsEveryChartOfAFullRun) {
  ScratchDir scratch;
  // A trace name that would end the paragraph and run a script if the page did not escape it.
  const std::string trace = "</code></p><script>document.body.dataset.injected = '1'</script>";
  const std::string run_dir = write_full_run(scratch, trace);
  const std::string html = default_report_path(run_dir);
  write_report(run_dir, html);
  EXPECT_FALSE(std::filesystem::exists(html + ".tmp"));

  const std::string dom = rendered_dom(scratch, html);
  expect_drawn(dom, {{"loss", kSteps, 2},
                     {"accuracy", kEpochs, 1},
                     {"lr", kSteps, 2},
                     {"throughput", kSteps, 2},
                     {"step-time", kSteps, kRanks + 1}});
  EXPECT_EQ(attributes(dom, "timeline-table")["data-rows"], std::to_string(kRanks));
  EXPECT_EQ(attributes(dom, "body").count("data-injected"), 0u);
  EXPECT_NE(dom.find("&lt;/code&gt;&lt;/p&gt;&lt;script&gt;"), std::string::npos);
}

// How many pixels differ from the white page, and how many of those are coloured: the plotted lines (and
// their legends) are, the text and grid lines are grey.
struct InkCount {
  int64_t ink = 0;
  int64_t coloured = 0;
};

InkCount count_ink(const data::Image& image) {
  InkCount count;
  for (size_t pixel = 0; pixel + 2 < image.pixels.size(); pixel += 3) {
    const auto [low, high] = std::minmax({image.pixels[pixel], image.pixels[pixel + 1], image.pixels[pixel + 2]});
    if (low < 230) ++count.ink;
    if (high - low > 60) ++count.coloured;
  }
  return count;
}

TEST_F(ReportTest, ScreenshotShowsPlottedLines) {
  ScratchDir scratch;
  const std::string run_dir = write_full_run(scratch);
  // The timeline's bars are coloured too, and would pass the check below on their own.
  std::filesystem::remove(run_dir + "/timeline_summary.json");
  const std::string html = default_report_path(run_dir);
  write_report(run_dir, html);
  const std::string png = scratch / "report.png";
  run_chromium(scratch, html, {"--hide-scrollbars", "--window-size=1280,2400", "--screenshot=" + png},
               scratch / "chromium.out");
  const data::Image image = data::read_image(png);
  EXPECT_EQ(image.width, 1280);
  EXPECT_EQ(image.height, 2400);
  const InkCount count = count_ink(image);
  // The page's text alone is tens of thousands of pixels; five charts of 60 points draw about 10000
  // coloured ones, and a page whose charts failed draws none.
  EXPECT_GT(count.ink, 20000) << "the page looks blank";
  EXPECT_GT(count.coloured, 4000) << "no plotted lines";
}

// An older run (no steps.jsonl), without a test set or a timeline, still gets the charts its epochs fill.
TEST_F(ReportTest, RunWithOnlyEpochsGetsTheChartsItCanFill) {
  ScratchDir scratch;
  write_text(scratch / "metrics.jsonl", lines(epoch_lines(/*total=*/0)));
  const std::string html = scratch / "only-epochs.html";
  write_report(scratch.path(), html);
  const std::string dom = rendered_dom(scratch, html);
  expect_drawn(dom, {{"loss", kEpochs, 1}, {"lr", kEpochs, 1}, {"throughput", kEpochs, 1}});
  EXPECT_TRUE(attributes(dom, "accuracy").empty());
  EXPECT_TRUE(attributes(dom, "step-time").empty());
  EXPECT_TRUE(attributes(dom, "timeline-table").empty());
  EXPECT_NE(dom.find("steps.jsonl not found"), std::string::npos);
  EXPECT_NE(dom.find("no test set: no accuracy chart"), std::string::npos);
}

TEST_F(ReportTest, UnwritableOutputIsAnErrorNamingIt) {
  ScratchDir scratch;
  const std::string run_dir = write_full_run(scratch);
  const std::string html = scratch / "absent/report.html";
  try {
    write_report(run_dir, html);
    FAIL() << "write_report did not throw";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("cannot write " + html + ": "), std::string::npos) << error.what();
  }
  EXPECT_FALSE(std::filesystem::exists(scratch / "absent"));
}

// `tandem report -o` given one of the run's own files, however spelled, is refused before anything is written.
TEST(Report, RefusesToReplaceAFileOfTheRun) {
  ScratchDir scratch;
  const std::string run_dir = write_full_run(scratch);
  const std::string run_name = std::filesystem::path(run_dir).filename().string();
  for (const std::string& output : {run_dir + "/metrics.jsonl", run_dir + "/../" + run_name + "/./steps.jsonl"}) {
    SCOPED_TRACE(output);
    const auto size_before = std::filesystem::file_size(output);
    try {
      write_report(run_dir, output);
      ADD_FAILURE() << "the report replaced a file of the run";
    } catch (const InvalidArgument& refused) {
      EXPECT_NE(std::string(refused.what()).find(output + " is the run's own file"), std::string::npos)
          << refused.what();
    }
    EXPECT_EQ(std::filesystem::file_size(output), size_before);
  }
}

TEST(Report, BuiltWithoutDygraphs) {
  if (TANDEM_HAVE_DYGRAPHS) GTEST_SKIP() << "this build has dygraphs";
  ScratchDir scratch;
  try {
    write_report(write_full_run(scratch), scratch / "report.html");
    FAIL() << "write_report did not throw";
  } catch (const UnsupportedError& error) {
    EXPECT_NE(std::string(error.what()).find("apt-get install libjs-dygraphs"), std::string::npos) << error.what();
  }
}

}  // namespace
}  // namespace tandem::monitor
