#pragma once
// What TensorBoard itself reads from a log directory: tests/monitor/read_tensorboard.py runs TensorBoard's
// EventAccumulator in the checkout's .venv (scripts/install-python-tools), so event files are judged by the
// reader users have, not by a parser of ours.
#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace tandem::testing {

struct ScalarPoint {
  int64_t step = 0;
  double value = 0;  // a float32 value, widened exactly
};

// tag -> points in the order TensorBoard keeps them, after its purge of the steps a SessionLog START restarts.
using TensorBoardScalars = std::map<std::string, std::vector<ScalarPoint>>;

// Throws, failing the calling test rather than skipping it, when .venv/bin/python or its tensorboard is
// missing (the message says to run scripts/install-python-tools) or the reader fails.
TensorBoardScalars read_tensorboard_scalars(const std::string& log_dir);

// Expects TensorBoard to hold exactly `expected` for `tag`, step for step and value for value.
void expect_scalars(const TensorBoardScalars& scalars, const std::string& tag,
                    const std::vector<ScalarPoint>& expected);

// The lines of a JSON-lines record (metrics.jsonl, steps.jsonl); a missing file fails the calling test.
std::vector<nlohmann::json> read_json_lines(const std::string& path);

// Each line's `key` at the line's "step", rounded to float32 as TensorBoard stores scalars: what TensorBoard
// must show for those records.
std::vector<ScalarPoint> points_of(const std::vector<nlohmann::json>& lines, const std::string& key);

// TensorBoard's view of RUN_DIR holds exactly the run's seven tags, each equal to what RUN_DIR/metrics.jsonl and
// steps.jsonl record.
void expect_tensorboard_matches_records(const std::string& run_dir);

}  // namespace tandem::testing
