#include "support/tensorboard_scalars.h"

#include <gtest/gtest.h>

#include <set>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "support/venv_python.h"

namespace tandem::testing {

TensorBoardScalars read_tensorboard_scalars(const std::string& log_dir) {
  const ProcessResult result =
      run_venv_python("tests/monitor/read_tensorboard.py", {log_dir}, std::chrono::seconds(60));
  if (result.timed_out || result.exit_code != 0) {
    throw std::runtime_error("read_tensorboard.py " + log_dir + " failed:\n" + result.output);
  }
  // The JSON is the last line; TensorBoard may log to stderr before it (a purge, say).
  std::string output = result.output;
  while (!output.empty() && output.back() == '\n') output.pop_back();
  const nlohmann::json parsed =
      nlohmann::json::parse(output.substr(output.rfind('\n') + 1), nullptr, /*allow_exceptions=*/false);
  if (!parsed.is_object()) throw std::runtime_error("read_tensorboard.py printed no JSON:\n" + result.output);
  TensorBoardScalars scalars;
  for (const auto& [tag, points] : parsed.items()) {
    for (const auto& point : points) scalars[tag].push_back({point.at(0).get<int64_t>(), point.at(1).get<double>()});
  }
  return scalars;
}

void expect_scalars(const TensorBoardScalars& scalars, const std::string& tag,
                    const std::vector<ScalarPoint>& expected) {
  const auto found = scalars.find(tag);
  ASSERT_NE(found, scalars.end()) << "TensorBoard read no tag " << tag;
  const std::vector<ScalarPoint>& actual = found->second;
  ASSERT_EQ(actual.size(), expected.size()) << tag;
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(actual[i].step, expected[i].step) << tag << " point " << i;
    EXPECT_EQ(actual[i].value, expected[i].value) << tag << " at step " << expected[i].step;
  }
}

std::vector<nlohmann::json> read_json_lines(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "missing " << path;
  std::vector<nlohmann::json> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
  return lines;
}

std::vector<ScalarPoint> points_of(const std::vector<nlohmann::json>& lines, const std::string& key) {
  std::vector<ScalarPoint> points;
  for (const nlohmann::json& line : lines) {
    points.push_back({line.at("step").get<int64_t>(), static_cast<float>(line.at(key).get<double>())});
  }
  return points;
}

void expect_tensorboard_matches_records(const std::string& run_dir) {
  const std::vector<nlohmann::json> metrics = read_json_lines(run_dir + "/metrics.jsonl");
  const std::vector<nlohmann::json> steps = read_json_lines(run_dir + "/steps.jsonl");
  const TensorBoardScalars scalars = read_tensorboard_scalars(run_dir);
  std::set<std::string> tags;
  for (const auto& [tag, points] : scalars) tags.insert(tag);
  EXPECT_EQ(tags, (std::set<std::string>{"loss", "accuracy", "learning_rate", "samples_per_second", "epoch",
                                         "step/loss", "step/learning_rate"}));
  expect_scalars(scalars, "loss", points_of(metrics, "loss"));
  expect_scalars(scalars, "accuracy", points_of(metrics, "accuracy"));
  expect_scalars(scalars, "learning_rate", points_of(metrics, "lr"));
  expect_scalars(scalars, "samples_per_second", points_of(metrics, "samples_per_second"));
  expect_scalars(scalars, "epoch", points_of(metrics, "epoch"));
  expect_scalars(scalars, "step/loss", points_of(steps, "loss"));
  expect_scalars(scalars, "step/learning_rate", points_of(steps, "lr"));
}

}  // namespace tandem::testing
