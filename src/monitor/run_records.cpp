#include "tandem/monitor/run_records.h"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tandem/util/error.h"

namespace tandem::monitor {
namespace {

using nlohmann::json;

constexpr double kNoValue = std::numeric_limits<double>::quiet_NaN();

// Thrown by the field readers below; for_each_json_line adds the file and line.
struct FieldError : InvalidArgument {
  using InvalidArgument::InvalidArgument;
};

// A number the run could not compute is written as null (nlohmann's NaN), and older runs lack newer fields:
// both read as NaN, which the report draws as a gap.
double number(const json& object, const char* key) {
  const auto field = object.find(key);
  if (field == object.end() || field->is_null()) return kNoValue;
  if (!field->is_number()) throw FieldError(fmt::format("\"{}\" is not a number", key));
  return field->get<double>();
}

int64_t whole_number(const json& object, const char* key) {
  const auto field = object.find(key);
  if (field == object.end() || !field->is_number_integer()) {
    throw FieldError(fmt::format("\"{}\" is missing or not a whole number", key));
  }
  return field->get<int64_t>();
}

// Calls `take` with each line's object. A last line that does not parse and lacks its newline is the one a killed
// run was writing: it is left out with a note. Any other bad line, a complete last one too (the run writes each
// line with its newline at once), throws InvalidArgument naming the file and the line.
void for_each_json_line(const std::string& path, std::vector<std::string>& notes,
                        const std::function<void(const json&)>& take) {
  std::ifstream file(path);
  std::vector<std::string> lines;
  bool last_line_ended = true;
  for (std::string line; std::getline(file, line);) {
    lines.push_back(line);
    last_line_ended = !file.eof();
  }
  while (!lines.empty() && lines.back().find_first_not_of(" \t\r") == std::string::npos) {
    lines.pop_back();
    last_line_ended = true;
  }
  const std::string name = std::filesystem::path(path).filename().string();
  for (size_t index = 0; index < lines.size(); ++index) {
    if (lines[index].find_first_not_of(" \t\r") == std::string::npos) continue;
    const json object = json::parse(lines[index], nullptr, /*allow_exceptions=*/false);
    const bool torn = index + 1 == lines.size() && !last_line_ended;
    if (!object.is_object() && torn) {
      notes.push_back(fmt::format("{}: left out its torn last line {} (the run was stopped while writing it)", name,
                                  index + 1));
      continue;
    }
    try {
      if (!object.is_object()) throw FieldError(object.is_discarded() ? "not valid JSON" : "not a JSON object");
      take(object);
    } catch (const FieldError& error) {
      throw InvalidArgument(fmt::format("{} line {}: {}; it is not a file tandem train wrote, or was edited: fix "
                                        "or delete the line",
                                        path, index + 1, error.what()));
    }
  }
}

}  // namespace

std::vector<EpochRecord> read_epoch_records(const std::string& path, std::vector<std::string>& notes) {
  std::map<int, EpochRecord> by_epoch;
  for_each_json_line(path, notes, [&](const json& line) {
    EpochRecord record;
    record.epoch = static_cast<int>(whole_number(line, "epoch"));
    record.loss = number(line, "loss");
    // A run without a test set writes no accuracy; older tandems wrote accuracy 0 of total 0.
    if (line.contains("accuracy") && number(line, "total") != 0) record.accuracy = number(line, "accuracy");
    record.lr = number(line, "lr");
    record.samples_per_second = number(line, "samples_per_second");
    record.train_seconds = number(line, "train_seconds");
    record.step = whole_number(line, "step");
    by_epoch[record.epoch] = record;
  });
  std::vector<EpochRecord> epochs;
  for (auto& [epoch, record] : by_epoch) epochs.push_back(std::move(record));
  return epochs;
}

std::vector<StepRecord> read_step_records(const std::string& path, std::vector<std::string>& notes) {
  std::map<int64_t, StepRecord> by_step;
  for_each_json_line(path, notes, [&](const json& line) {
    StepRecord record;
    record.step = whole_number(line, "step");
    record.epoch = static_cast<int>(whole_number(line, "epoch"));
    record.loss = number(line, "loss");
    record.lr = number(line, "lr");
    record.seconds = number(line, "seconds");
    record.samples_per_second = number(line, "samples_per_second");
    const json& rank_seconds = line.value("rank_seconds", json::array());
    if (!rank_seconds.is_array()) throw FieldError("\"rank_seconds\" is not a list");
    for (const json& seconds : rank_seconds) {
      if (!seconds.is_number() && !seconds.is_null()) throw FieldError("\"rank_seconds\" holds a non-number");
      record.rank_seconds.push_back(seconds.is_null() ? kNoValue : seconds.get<double>());
    }
    by_step[record.step] = std::move(record);
  });
  std::vector<StepRecord> steps;
  for (auto& [step, record] : by_step) steps.push_back(std::move(record));
  return steps;
}

namespace {

TimelineSummary read_timeline(const std::string& path) {
  std::ifstream file(path);
  std::stringstream text;
  text << file.rdbuf();
  const json summary = json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  try {
    if (!summary.is_object()) throw FieldError("not a JSON object");
    TimelineSummary timeline;
    const json& trace = summary.value("trace", json(""));
    if (!trace.is_string()) throw FieldError("\"trace\" is not a file name");
    timeline.trace = trace.get<std::string>();
    timeline.first_step = whole_number(summary, "first_step");
    timeline.last_step = whole_number(summary, "last_step");
    timeline.world_size = static_cast<int>(whole_number(summary, "world_size"));
    const json& ranks = summary.value("ranks", json::array());
    if (!ranks.is_array()) throw FieldError("\"ranks\" is not a list");
    for (const json& rank : ranks) {
      if (!rank.is_object()) throw FieldError("\"ranks\" holds a non-object");
      RankTimelineSummary phases;
      phases.rank = static_cast<int>(whole_number(rank, "rank"));
      phases.step_ms = number(rank, "step_ms");
      phases.forward_ms = number(rank, "forward_ms");
      phases.backward_ms = number(rank, "backward_ms");
      phases.allreduce_ms = number(rank, "allreduce_ms");
      phases.allreduce_hidden_ms = number(rank, "allreduce_hidden_ms");
      phases.wait_ms = number(rank, "wait_ms");
      phases.optimizer_ms = number(rank, "optimizer_ms");
      timeline.ranks.push_back(phases);
    }
    return timeline;
  } catch (const FieldError& error) {
    throw InvalidArgument(fmt::format("{}: {}; it is not a file tandem train wrote, or was edited: fix or delete it",
                                      path, error.what()));
  }
}

}  // namespace

RunRecords read_run_records(const std::string& run_dir) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(run_dir)) {
    throw InvalidArgument(fmt::format("run directory {} not found: give the folder tandem train wrote (`run_dir`, "
                                      "or one under runs/)",
                                      run_dir));
  }
  RunRecords records;
  records.run_dir = run_dir;
  const fs::path dir(run_dir);
  const std::string metrics = (dir / "metrics.jsonl").string();
  if (!fs::is_regular_file(metrics)) {
    throw InvalidArgument(fmt::format("{} not found: {} is not a run directory of tandem train, which writes "
                                      "metrics.jsonl there from the run's start",
                                      metrics, run_dir));
  }
  records.epochs = read_epoch_records(metrics, records.notes);

  const std::string steps = (dir / "steps.jsonl").string();
  if (fs::is_regular_file(steps)) {
    records.steps = read_step_records(steps, records.notes);
  } else {
    records.notes.push_back("steps.jsonl not found (a run from an older tandem): no per-step points");
  }
  const std::string timeline = (dir / "timeline_summary.json").string();
  if (fs::is_regular_file(timeline)) records.timeline = read_timeline(timeline);
  return records;
}

}  // namespace tandem::monitor
