// `tandem bench allreduce`: the size grammar, nccl-tests' bus bandwidth, the measurement on ranks as threads,
// and the program's table and JSON at world size 1.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "support/processes.h"
#include "support/thread_ranks.h"
#include "bench/allreduce/allreduce_bench.h"
#include "tandem/util/error.h"

namespace tandem {
namespace {

TEST(BenchSizes, ParseUnitsRangesAndLists) {
  EXPECT_EQ(bench::parse_size("4096"), 4096);
  EXPECT_EQ(bench::parse_size("4K"), 4096);
  EXPECT_EQ(bench::parse_size("64m"), int64_t{64} << 20);
  EXPECT_EQ(bench::parse_size("1G"), int64_t{1} << 30);
  EXPECT_EQ(bench::parse_sizes("4K..32K"), (std::vector<int64_t>{4096, 8192, 16384, 32768}));
  EXPECT_EQ(bench::parse_sizes("4K,1M"), (std::vector<int64_t>{4096, int64_t{1} << 20}));
  EXPECT_EQ(bench::parse_sizes("4K..64M").size(), 15u);
  for (const char* bad : {"", "K", "4X", "-4K", "0", "4KB"}) EXPECT_THROW(bench::parse_size(bad), InvalidArgument) << bad;
  EXPECT_THROW(bench::parse_sizes("64M..4K"), InvalidArgument);
  // Sizes that would overflow as bytes, or when a range doubles them.
  EXPECT_THROW(bench::parse_size("99999999999G"), InvalidArgument);
  EXPECT_THROW(bench::parse_sizes("4K..9223372036854775807"), InvalidArgument);
  EXPECT_EQ(bench::parse_size("1048576G"), bench::kLargestSize);
  EXPECT_EQ(bench::format_size(4096), "4K");
  EXPECT_EQ(bench::format_size(int64_t{256} << 20), "256M");
  EXPECT_EQ(bench::format_size(1001), "1001");
}

TEST(BenchBandwidth, BusBandwidthFollowsNcclTests) {
  EXPECT_DOUBLE_EQ(bench::allreduce_bus_bandwidth(10.0, 1), 10.0);
  EXPECT_DOUBLE_EQ(bench::allreduce_bus_bandwidth(10.0, 2), 10.0);
  EXPECT_DOUBLE_EQ(bench::allreduce_bus_bandwidth(10.0, 4), 15.0);
  EXPECT_EQ(bench::iterations_for(4096, 0), 200);
  EXPECT_EQ(bench::iterations_for(int64_t{64} << 20, 0), 32);
  EXPECT_EQ(bench::iterations_for(int64_t{1} << 30, 0), 5);
  EXPECT_EQ(bench::iterations_for(int64_t{1} << 30, 7), 7);
}

TEST(BenchMemcpy, MeasuresAPositiveBandwidth) {
  bench::MemcpyResult result = bench::measure_memcpy(int64_t{4} << 20, 3);
  EXPECT_EQ(result.bytes, int64_t{4} << 20);
  EXPECT_GT(result.gbps, 0.0);
  EXPECT_NEAR(result.gbps, result.bytes / result.seconds_per_copy / 1e9, 1e-6 * result.gbps);
}

TEST(BenchAllreduce, TwoThreadRanksAgreeOnEveryRow) {
  std::vector<std::vector<bench::AllreduceRow>> rows(2);
  testing::run_thread_ranks(2, [&](int rank, comm::Communicator& comm) {
    bench::AllreduceBenchOptions options;
    options.sizes = {4096, 1001, int64_t{1} << 20};
    options.iters = 3;
    options.warmup = 1;
    rows[rank] = bench::run_allreduce_bench(comm, options);
  });
  ASSERT_EQ(rows[0].size(), 3u);
  for (size_t i = 0; i < rows[0].size(); ++i) {
    const auto& row = rows[0][i];
    EXPECT_TRUE(row.correct) << "size " << row.bytes;
    EXPECT_EQ(row.iters, 3);
    EXPECT_GT(row.seconds_per_op, 0.0);
    EXPECT_DOUBLE_EQ(row.busbw_gbps, row.algbw_gbps);  // 2(n-1)/n = 1 at n = 2
    // The slowest rank's time is all-reduced, so both ranks report the same figure.
    EXPECT_DOUBLE_EQ(rows[1][i].seconds_per_op, row.seconds_per_op);
  }
  // 1001 bytes round down to whole float32 elements.
  EXPECT_EQ(rows[0][1].bytes, 1000);
}

// One rank moves no data: the table says so and keeps the time of a call, with no bandwidth beside it.
TEST(BenchProgram, PrintsTableAndJsonAtWorldSizeOne) {
  std::string json_path = ::testing::TempDir() + "tandem_bench_allreduce.json";
  std::filesystem::remove(json_path);
  testing::ProcessResult result =
      testing::run_process({testing::tandem_cli(), "bench", "allreduce", "--device", "cpu", "--sizes", "4K..16K",
                            "--iters", "2", "--memcpy-size", "1M", "--json", json_path});
  ASSERT_FALSE(result.timed_out) << result.output;
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("world size 1: an all-reduce over one rank moves no data"), std::string::npos)
      << result.output;
  EXPECT_NE(result.output.find("time/op(us)"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("backend gloo, 1 rank,"), std::string::npos) << result.output;
  EXPECT_EQ(result.output.find("busbw"), std::string::npos) << result.output;
  EXPECT_EQ(result.output.find("%"), std::string::npos) << result.output;
  EXPECT_NE(result.output.find("memcpy bandwidth"), std::string::npos) << result.output;
  std::ifstream file(json_path);
  ASSERT_TRUE(file) << "no JSON written:\n" << result.output;
  nlohmann::json json = nlohmann::json::parse(file);
  EXPECT_EQ(json["backend"], "gloo");
  EXPECT_EQ(json["world_size"], 1);
  ASSERT_EQ(json["results"].size(), 3u);
  EXPECT_EQ(json["results"][2]["bytes"], 16384);
  EXPECT_TRUE(json["results"][0]["correct"].get<bool>());
  EXPECT_GT(json["results"][0]["time_us"].get<double>(), 0.0);
  EXPECT_FALSE(json["results"][0].contains("busbw_gbps"));
  EXPECT_TRUE(json.contains("note"));
  EXPECT_GT(json["memcpy"]["gbps"].get<double>(), 0.0);
}

TEST(BenchProgram, TrainRecordsItsDdpOptionsAndEveryRound) {
  std::string json_path = ::testing::TempDir() + "tandem_bench_train.json";
  std::filesystem::remove(json_path);
  testing::ProcessResult result = testing::run_process(
      {testing::tandem_cli(), "bench", "train", "--world-sizes", "1", "--steps", "2", "--repeats", "1", "--warmup",
       "1", "--rounds", "2", "--bucket-cap-mb", "5", "--first-bucket-cap-mb", "2", "--bucket-plan", "caps",
       "--gradient-as-bucket-view", "--json", json_path});
  ASSERT_FALSE(result.timed_out) << result.output;
  ASSERT_EQ(result.exit_code, 0) << result.output;
  EXPECT_NE(result.output.find("buckets of 5 MiB (first 2 MiB, plan caps), gradient_as_bucket_view"), std::string::npos)
      << result.output;
  std::ifstream file(json_path);
  ASSERT_TRUE(file) << "no JSON written:\n" << result.output;
  nlohmann::json json = nlohmann::json::parse(file);
  EXPECT_EQ(json["bucket_cap_mb"], 5.0);
  EXPECT_EQ(json["first_bucket_cap_mb"], 2.0);
  EXPECT_EQ(json["bucket_plan"], "caps");
  EXPECT_TRUE(json["gradient_as_bucket_view"].get<bool>());
  EXPECT_EQ(json["rounds"], 2);
  ASSERT_EQ(json["rows"].size(), 1u);
  EXPECT_GT(json["rows"][0]["samples_per_s"].get<double>(), 0.0);
  EXPECT_EQ(json["rows"][0]["rounds"].size(), 2u);
  EXPECT_EQ(json["rows"][0]["independent_rounds"].size(), 2u);
}

// At N=2 the table has a DataParallel row beside the DDP one: one process, two replicas, the same samples per step,
// compared with the same independent processes.
TEST(BenchProgram, TrainHasADataParallelRowBesideDdp) {
  std::string json_path = ::testing::TempDir() + "tandem_bench_train_dp.json";
  std::filesystem::remove(json_path);
  testing::ProcessResult result = testing::run_process(
      {testing::tandem_cli(), "bench", "train", "--world-sizes", "2", "--steps", "2", "--repeats", "1", "--warmup",
       "1", "--batch-size", "8", "--json", json_path});
  ASSERT_FALSE(result.timed_out) << result.output;
  ASSERT_EQ(result.exit_code, 0) << result.output;
  std::ifstream file(json_path);
  ASSERT_TRUE(file) << "no JSON written:\n" << result.output;
  nlohmann::json rows = nlohmann::json::parse(file)["rows"];
  ASSERT_EQ(rows.size(), 2u) << result.output;
  EXPECT_EQ(rows[0]["wrapper"], "DDP");
  EXPECT_EQ(rows[1]["wrapper"], "DP");
  EXPECT_EQ(rows[1]["backend"], "-");
  EXPECT_EQ(rows[1]["world_size"], 2);
  EXPECT_GT(rows[1]["samples_per_s"].get<double>(), 0.0);
  EXPECT_EQ(rows[1]["independent_rounds"], rows[0]["independent_rounds"]);
  EXPECT_NE(result.output.find("   tandem      DP       -   2"), std::string::npos) << result.output;
}

TEST(BenchProgram, TrainRefusesAFirstBucketCapThatPyTorchCannotMatch) {
  testing::ProcessResult result = testing::run_process(
      {testing::tandem_cli(), "bench", "train", "--first-bucket-cap-mb", "2", "--compare", "pytorch"});
  EXPECT_EQ(result.exit_code, 2) << result.output;
  EXPECT_NE(result.output.find("--first-bucket-cap-mb has no counterpart in PyTorch's DDP"), std::string::npos)
      << result.output;
}

}  // namespace
}  // namespace tandem
