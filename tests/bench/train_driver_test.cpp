// `tandem bench train`: the world sizes it reads, and with a comm hook each DDP row says what the hook
// all-reduced per step, and PowerSGD's figure is a fraction of plain averaging's.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "bench/harness/world_sizes.h"
#include "support/processes.h"
#include "tandem/util/error.h"

namespace tandem {
namespace {

TEST(BenchWorldSizes, ParseWholeNumbersOfProcessesEachOnce) {
  EXPECT_EQ(bench::parse_world_sizes("1,2,4"), (std::vector<int>{1, 2, 4}));
  EXPECT_EQ(bench::parse_world_sizes("3"), (std::vector<int>{3}));
  for (const char* bad : {"", "0", "-2", "abc", "1,", "2K", "1.5", "2,2", "99999999999"}) {
    EXPECT_THROW(bench::parse_world_sizes(bad), InvalidArgument) << bad;
  }
}

// The DDP row of a two-rank `bench train` run with `hook`.
nlohmann::json ddp_row_with_hook(const std::string& hook) {
  const std::string json_path = ::testing::TempDir() + "tandem_bench_train_" + hook + ".json";
  std::filesystem::remove(json_path);
  testing::ProcessResult result = testing::run_process(
      {testing::tandem_cli(), "bench", "train", "--world-sizes", "2", "--steps", "2", "--repeats", "1", "--warmup",
       "2", "--batch-size", "8", "--comm-hook", hook, "--json", json_path},
      {}, std::chrono::seconds(120));
  EXPECT_FALSE(result.timed_out) << result.output;
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("MB/step"), std::string::npos) << result.output;
  std::ifstream file(json_path);
  EXPECT_TRUE(file) << "no JSON written:\n" << result.output;
  if (!file) return {};
  nlohmann::json json = nlohmann::json::parse(file);
  EXPECT_EQ(json["comm_hook"], hook);
  return json["rows"][0];
}

TEST(BenchTrainCommHook, ReportsBytesPerStepAndPowerSgdSendsAFraction) {
  const nlohmann::json average = ddp_row_with_hook("average");
  const nlohmann::json powersgd = ddp_row_with_hook("powersgd");
  ASSERT_FALSE(average.is_null());
  ASSERT_FALSE(powersgd.is_null());
  ASSERT_EQ(average["wrapper"], "DDP");
  // Plain averaging all-reduces every gradient in float32, plus the last bucket's few bookkeeping elements.
  const double parameters = average["rounds"][0]["parameters"].get<double>();
  const double average_bytes = average["bytes_per_step"].get<double>();
  EXPECT_GE(average_bytes, parameters * 4);
  EXPECT_LT(average_bytes, parameters * 4 + 1024);
  // Rank 1 from the third step on (the timed steps come after the warm-up): the CNN's large layers shrink to
  // (rows + columns) elements each.
  EXPECT_LT(powersgd["bytes_per_step"].get<double>(), average_bytes / 4);
  EXPECT_GT(powersgd["samples_per_s"].get<double>(), 0.0);
}

}  // namespace
}  // namespace tandem
