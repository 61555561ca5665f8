// `tandem bench overhead`: its ratios are paired within rounds, its backend list is checked, and a short run
// writes a row per framework, wrapper, backend and world size, with the all-reduce's latency beside each DDP row.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "bench/overhead/overhead_driver.h"
#include "support/processes.h"
#include "support/scratch_dir.h"
#include "tandem/util/error.h"

namespace tandem::overhead_driver_test {
namespace {

bench::OverheadRow row_of(const std::string& framework, const std::vector<double>& us_per_round) {
  bench::OverheadRow row{framework, "DDP", "gloo", 2, {}};
  for (double us : us_per_round) row.rounds.push_back({{"us_per_step_median", us}});
  return row;
}

// The ratio of medians here would be 200 / 300; each round's own ratio (0.5, 1, 0.3) has the median 0.5.
TEST(BenchOverheadRatio, IsTheMedianOfEachRoundsRatio) {
  const bench::OverheadRow tandem = row_of("tandem", {100, 200, 300});
  const bench::OverheadRow pytorch = row_of("pytorch", {200, 200, 1000});
  EXPECT_DOUBLE_EQ(bench::paired_overhead_ratio(tandem, pytorch), 0.5);
  EXPECT_THROW(bench::paired_overhead_ratio(tandem, row_of("pytorch", {200})), Error);
}

TEST(BenchOverheadBackends, ParseCpuBackendsEachOnce) {
  EXPECT_EQ(bench::parse_overhead_backends("gloo"), (std::vector<std::string>{"gloo"}));
  for (const char* bad : {"", "nccl", "gloo,", "gloo,gloo", "GLOO"}) {
    EXPECT_THROW(bench::parse_overhead_backends(bad), Error) << bad;
  }
}

TEST(BenchOverheadRun, WritesEveryRowWithItsAllReduceLatency) {
  const testing::ScratchDir scratch;
  const std::string json_path = (std::filesystem::path(scratch.path()) / "overhead.json").string();
  const testing::ProcessResult result = testing::run_process(
      {testing::tandem_cli(), "bench", "overhead", "--world-sizes", "1,2", "--backends", "gloo", "--compare", "none",
       "--steps", "3", "--repeats", "1", "--warmup", "1", "--rounds", "2", "--json", json_path},
      {}, std::chrono::seconds(120));
  ASSERT_FALSE(result.timed_out) << result.output;
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("us/step"), std::string::npos) << result.output;
  std::ifstream file(json_path);
  ASSERT_TRUE(file) << "no JSON written:\n" << result.output;
  const nlohmann::json rows = nlohmann::json::parse(file)["rows"];
  ASSERT_EQ(rows.size(), 3u) << rows.dump(2);
  EXPECT_EQ(rows[0]["wrapper"], "plain");
  EXPECT_EQ(rows[0]["allreduce_us"], 0.0);
  for (size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(rows[i]["us_per_step_per_round"].size(), 2u) << rows[i].dump();
    EXPECT_GT(rows[i]["us_per_step_median"].get<double>(), 0.0) << rows[i].dump();
    EXPECT_FALSE(rows[i].contains("ratio_to_pytorch")) << "no PyTorch rows to pair with: " << rows[i].dump();
  }
  for (size_t i : {1u, 2u}) {
    EXPECT_EQ(rows[i]["wrapper"], "DDP");
    EXPECT_EQ(rows[i]["backend"], "gloo");
    EXPECT_EQ(rows[i]["world_size"], static_cast<int>(i));
    EXPECT_GT(rows[i]["allreduce_us"].get<double>(), 0.0) << rows[i].dump();
  }
}

}  // namespace
}  // namespace tandem::overhead_driver_test
