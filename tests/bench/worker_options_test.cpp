// The benchmarks' workers get their options as one document written from the driver's options struct
// (bench/harness/worker_options.h): every field the driver sets comes back, unchanged, in the worker's struct.
#include <gtest/gtest.h>

#include <string>

#include "bench/harness/worker_options.h"
#include "bench/memory/memory_worker.h"
#include "bench/overhead/overhead_worker.h"
#include "bench/train/train_worker.h"
#include "support/scratch_dir.h"
#include "tandem/util/error.h"

namespace tandem::bench::worker_options_test {
namespace {

// Writes `options` as the driver does and reads it back as the worker does; checks the command line names the
// file and nothing else of the options.
template <typename Options>
Options through_the_document(const Options& options, const std::string& benchmark) {
  const testing::ScratchDir scratch;
  const std::string file = scratch / "worker.options.json";
  const std::string command = worker_command("/opt/tandem", benchmark, options, file);
  EXPECT_EQ(command, "'/opt/tandem' bench " + benchmark + " --worker-options '" + file + "'");
  return read_worker_options<Options>(file);
}

TEST(BenchWorkerOptions, TrainWorkerGetsEveryFieldTheDriverSet) {
  TrainWorkerOptions sent;
  sent.mode = "fsdp";
  sent.replicas = 3;
  sent.result_path = "/tmp/a result.json";
  sent.device = "cuda";
  sent.backend = "nccl";
  sent.threads = 4;
  TrainBenchOptions& b = sent.bench;
  b.model = "resnet18";
  b.image_size = 32;
  b.batch_size = 7;
  b.steps = 3;
  b.repeats = 2;
  b.warmup = 1;
  b.lr = 0.5;
  b.seed = 9;
  b.ddp.bucket_cap_mb = 0.25;
  b.ddp.first_bucket_cap_mb = 2;
  b.ddp.bucket_plan = ddp::BucketPlan::kCaps;
  b.ddp.gradient_as_bucket_view = true;
  b.comm_hook = "powersgd";
  b.powersgd.matrix_approximation_rank = 4;
  b.powersgd.start_powersgd_iter = 5;
  b.powersgd.min_compression_rate = 3;
  b.powersgd.use_error_feedback = false;
  b.powersgd.warm_start = false;
  b.powersgd.orthogonalization_epsilon = 1e-8;
  b.powersgd.random_seed = 11;
  b.fsdp.emplace();
  b.fsdp->reshard_after_forward = false;

  const TrainWorkerOptions got = through_the_document(sent, "train");
  EXPECT_EQ(got.mode, sent.mode);
  EXPECT_EQ(got.replicas, sent.replicas);
  EXPECT_EQ(got.result_path, sent.result_path);
  EXPECT_EQ(got.device, sent.device);
  EXPECT_EQ(got.backend, sent.backend);
  EXPECT_EQ(got.threads, sent.threads);
  const TrainBenchOptions& g = got.bench;
  EXPECT_EQ(g.model, b.model);
  EXPECT_EQ(g.image_size, b.image_size);
  EXPECT_EQ(g.batch_size, b.batch_size);
  EXPECT_EQ(g.steps, b.steps);
  EXPECT_EQ(g.repeats, b.repeats);
  EXPECT_EQ(g.warmup, b.warmup);
  EXPECT_EQ(g.lr, b.lr);
  EXPECT_EQ(g.seed, b.seed);
  EXPECT_EQ(g.ddp.bucket_cap_mb, b.ddp.bucket_cap_mb);
  EXPECT_EQ(g.ddp.first_bucket_cap_mb, b.ddp.first_bucket_cap_mb);
  EXPECT_EQ(g.ddp.bucket_plan, b.ddp.bucket_plan);
  EXPECT_EQ(g.ddp.gradient_as_bucket_view, b.ddp.gradient_as_bucket_view);
  EXPECT_EQ(g.comm_hook, b.comm_hook);
  EXPECT_EQ(g.powersgd.matrix_approximation_rank, b.powersgd.matrix_approximation_rank);
  EXPECT_EQ(g.powersgd.start_powersgd_iter, b.powersgd.start_powersgd_iter);
  EXPECT_EQ(g.powersgd.min_compression_rate, b.powersgd.min_compression_rate);
  EXPECT_EQ(g.powersgd.use_error_feedback, b.powersgd.use_error_feedback);
  EXPECT_EQ(g.powersgd.warm_start, b.powersgd.warm_start);
  EXPECT_EQ(g.powersgd.orthogonalization_epsilon, b.powersgd.orthogonalization_epsilon);
  EXPECT_EQ(g.powersgd.random_seed, b.powersgd.random_seed);
  ASSERT_TRUE(g.fsdp.has_value());
  EXPECT_FALSE(g.fsdp->reshard_after_forward);

  // A plain worker's document has no FSDP options, and the worker's struct none either.
  sent.bench.fsdp.reset();
  EXPECT_FALSE(through_the_document(sent, "train").bench.fsdp.has_value());
}

TEST(BenchWorkerOptions, MemoryWorkerGetsEveryFieldTheDriverSet) {
  MemoryWorkerOptions sent;
  sent.bench.strategy = "ddp";
  sent.bench.model = "resnet18";
  sent.bench.mlp_parameters = 1234;
  sent.bench.mlp_width = 64;
  sent.bench.image_size = 16;
  sent.bench.batch_size = 2;
  sent.bench.steps = 5;
  sent.bench.reshard_after_forward = false;
  sent.bench.seed = 3;
  sent.result_prefix = "/tmp/memory_2";
  sent.threads = 2;
  const MemoryWorkerOptions got = through_the_document(sent, "memory");
  EXPECT_EQ(nlohmann::json(got), nlohmann::json(sent));
  EXPECT_EQ(got.bench.mlp_parameters, 1234);
  EXPECT_EQ(got.result_prefix, sent.result_prefix);
  EXPECT_FALSE(got.bench.reshard_after_forward);
}

TEST(BenchWorkerOptions, OverheadWorkerGetsEveryFieldTheDriverSet) {
  OverheadWorkerOptions sent{"ddp", "mpi", "/tmp/ddp_mpi_2.json", {}};
  sent.bench.batch_size = 3;
  sent.bench.steps = 4;
  sent.bench.repeats = 6;
  sent.bench.warmup = 7;
  const OverheadWorkerOptions got = through_the_document(sent, "overhead");
  EXPECT_EQ(got.mode, "ddp");
  EXPECT_EQ(got.backend, "mpi");
  EXPECT_EQ(got.result_path, sent.result_path);
  EXPECT_EQ(got.bench.batch_size, 3);
  EXPECT_EQ(got.bench.steps, 4);
  EXPECT_EQ(got.bench.repeats, 6);
  EXPECT_EQ(got.bench.warmup, 7);
}

TEST(BenchWorkerOptions, AMissingDocumentIsOneLine) {
  EXPECT_THROW(read_worker_options<OverheadWorkerOptions>("/nonexistent/worker.options.json"), InvalidArgument);
}

}  // namespace
}  // namespace tandem::bench::worker_options_test
