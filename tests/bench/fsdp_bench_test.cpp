// `tandem bench train --strategy fsdp` and `tandem bench memory`: what they read, what they refuse in one line,
// and that their tables hold what they say (FSDP and DDP rows side by side; bytes per rank that halve with the
// ranks). No timings are checked.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/memory/memory_bench.h"
#include "bench/memory/memory_driver.h"
#include "support/bad_input.h"
#include "support/processes.h"
#include "tandem/util/error.h"

namespace tandem::bench::fsdp_bench_test {
namespace {

using testing::BadInput;

TEST(BenchMemoryParameterCount, ReadsDecimalUnits) {
  EXPECT_EQ(parse_parameter_count("600M"), 600'000'000);
  EXPECT_EQ(parse_parameter_count("2k"), 2'000);
  EXPECT_EQ(parse_parameter_count("1G"), 1'000'000'000);
  EXPECT_EQ(parse_parameter_count("12345"), 12'345);
  for (const char* bad : {"", "0", "M", "-3", "1.5M", "1T", "2000G", "12 M", "99999999999999"}) {
    EXPECT_THROW(parse_parameter_count(bad), InvalidArgument) << bad;
  }
}

TEST(BenchMemoryMlpShape, RoundsToWholeLayersOfTheWidth) {
  const MlpShape shape = mlp_shape(537'000'000, 8192);
  EXPECT_EQ(shape.layers, 8);
  EXPECT_EQ(shape.parameters(), 8 * (8192 * 8192 + 8192) + 8192 * 10 + 10);
  EXPECT_THROW(mlp_shape(1'000, 8192), InvalidArgument);
}

TEST(BenchMemoryEstimate, DdpHoldsSixteenBytesPerParameterOnEveryRankAndFsdpLess) {
  MemoryBenchOptions options;
  options.strategy = "ddp";
  const int64_t parameters = 400'000'000;
  EXPECT_EQ(estimated_bytes_per_rank(options, parameters, 4), 16 * parameters);
  options.strategy = "fsdp";
  const int64_t sharded = estimated_bytes_per_rank(options, parameters, 4);
  EXPECT_LT(sharded, 16 * parameters);
  // Every rank builds the whole float32 model before sharding it.
  EXPECT_GE(sharded, 4 * parameters);
}

std::vector<std::string> bench(const char* which, std::vector<std::string> args) {
  args.insert(args.begin(), {"bench", which});
  return args;
}

std::vector<BadInput> bad_inputs() {
  return {
      {"TrainFsdpWithoutRanksToShardOver", bench("train", {"--strategy", "fsdp", "--world-sizes", "1"}),
       {"--strategy fsdp", "--world-sizes", "--world-sizes 2"}},
      {"TrainReshardWithoutFsdp", bench("train", {"--reshard-after-forward", "false"}),
       {"--reshard-after-forward is only read with --strategy fsdp"}},
      {"TrainFsdpWithEndToEnd", bench("train", {"--end-to-end", "--strategy", "fsdp"}),
       {"--strategy is not read with --end-to-end"}},
      {"TrainUnknownStrategy", bench("train", {"--strategy", "zero3"}), {"--strategy", "zero3"}},
      {"MemoryDdpBeyondTheHost", bench("memory", {"--strategy", "ddp", "--world-sizes", "4", "--mlp-params", "1000G"}),
       {"--strategy ddp at 4 ranks needs at least", "16 bytes each per rank", "use --strategy fsdp"}},
      {"MemoryMlpParamsWithAnotherModel", bench("memory", {"--model", "resnet18", "--mlp-params", "10M"}),
       {"--mlp-params is only read with --model mlp"}},
      {"MemoryParamsNotACount", bench("memory", {"--mlp-params", "1.5M"}), {"--mlp-params", "'1.5M' is not a parameter count"}},
      {"MemoryParamsBelowOneLayer", bench("memory", {"--mlp-params", "1K"}),
       {"--mlp-params 1000 is less than one hidden layer of --mlp-width 8192"}},
      {"MemoryReshardWithDdp", bench("memory", {"--strategy", "ddp", "--reshard-after-forward", "false"}),
       {"--reshard-after-forward is only read with --strategy fsdp"}},
      {"MemoryImageSizeWithTheMlp", bench("memory", {"--image-size", "64"}), {"--image-size is not read with --model mlp"}},
      {"MemoryUnknownStrategy", bench("memory", {"--strategy", "zero"}), {"--strategy", "zero"}},
  };
}

class BadFsdpBenchInput : public ::testing::TestWithParam<BadInput> {};

TEST_P(BadFsdpBenchInput, IsRefusedInOneLineBeforeAnyWorker) { testing::expect_one_line_refusal(GetParam()); }

INSTANTIATE_TEST_SUITE_P(Table, BadFsdpBenchInput, ::testing::ValuesIn(bad_inputs()),
                         [](const ::testing::TestParamInfo<BadInput>& info) { return info.param.name; });

nlohmann::json run_with_json(std::vector<std::string> args, const std::string& name) {
  const std::string json_path = ::testing::TempDir() + "tandem_fsdp_bench_" + name + ".json";
  std::filesystem::remove(json_path);
  args.insert(args.begin(), testing::tandem_cli());
  args.insert(args.end(), {"--json", json_path});
  testing::ProcessResult result = testing::run_process(args, {}, std::chrono::seconds(180));
  EXPECT_FALSE(result.timed_out) << result.output;
  EXPECT_EQ(result.exit_code, 0) << result.output;
  std::ifstream file(json_path);
  EXPECT_TRUE(file) << "no JSON written:\n" << result.output;
  if (!file) return {};
  return nlohmann::json::parse(file);
}

// Per rank, FSDP's shards, their gradients and AdamW's state are a share of the model's, padding aside.
TEST(BenchMemory, FsdpBytesPerRankAreTheModelsSplitOverTheRanks) {
  const nlohmann::json json = run_with_json(
      {"bench", "memory", "--world-sizes", "1,2", "--mlp-params", "200K", "--mlp-width", "256", "--steps", "1"},
      "memory");
  ASSERT_TRUE(json.contains("jobs")) << json.dump();
  const int64_t model_bytes = 4 * json["parameters"].get<int64_t>();
  for (const auto& job : json["jobs"]) {
    const int64_t world = job["world_size"].get<int64_t>();
    ASSERT_EQ(job["ranks"].size(), static_cast<size_t>(world));
    for (const auto& rank : job["ranks"]) {
      const int64_t shards = rank["parameter_bytes"].get<int64_t>();
      EXPECT_GE(shards, model_bytes / world);
      EXPECT_LE(shards, model_bytes / world + 4 * 4 * world);  // each of the 4 units padded to the world size
      EXPECT_EQ(rank["gradient_bytes"].get<int64_t>(), shards);
      EXPECT_EQ(rank["optimizer_state_bytes"].get<int64_t>(), 2 * shards);  // AdamW's two moments
      EXPECT_GT(rank["peak_gathered_bytes"].get<int64_t>(), 0);
      EXPECT_GT(rank["peak_resident_train"].get<int64_t>(), 0);
    }
  }
}

// With --strategy fsdp, the 2-rank FSDP job and DDP job are rows of the same table, against the same independent
// processes in each round.
TEST(BenchTrainFsdp, ShowsTheFsdpAndDdpRowsSideBySide) {
  const nlohmann::json json = run_with_json({"bench", "train", "--strategy", "fsdp", "--world-sizes", "2", "--steps",
                                             "1", "--repeats", "1", "--warmup", "1", "--batch-size", "4"},
                                            "train");
  ASSERT_TRUE(json.contains("rows")) << json.dump();
  EXPECT_EQ(json["strategy"], "fsdp");
  ASSERT_EQ(json["rows"].size(), 2u);
  EXPECT_EQ(json["rows"][0]["wrapper"], "FSDP");
  EXPECT_EQ(json["rows"][1]["wrapper"], "DDP");
  for (const auto& row : json["rows"]) {
    EXPECT_EQ(row["world_size"], 2);
    EXPECT_GT(row["samples_per_s"].get<double>(), 0.0);
    EXPECT_EQ(row["independent_rounds"].size(), 1u);
  }
  EXPECT_EQ(json["rows"][0]["independent_rounds"], json["rows"][1]["independent_rounds"]);
}

}  // namespace
}  // namespace tandem::bench::fsdp_bench_test
