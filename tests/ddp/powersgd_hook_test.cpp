// The PowerSGD comm hook: PyTorch's powerSGD_hook numerics on two real processes (tests/fixtures/powersgd_pytorch.json,
// made by make_powersgd_fixture.py), and inside DDP on thread ranks: plain averaging before its start iteration,
// replicas that stay identical after it, the reducer's bookkeeping kept intact, the one bucket rebuild followed,
// and what goes on the wire.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "ddp_fixtures.h"
#include "support/json_fixture.h"
#include "support/processes.h"
#include "support/thread_ranks.h"
#include "tandem/comm/process_group.h"
#include "tandem/ddp/powersgd_hook.h"
#include "tandem/util/error.h"

namespace tandem::testing {
namespace {

// Float32 rounding in a different order than Python's (the BLAS of another LibTorch), carried through the
// power iteration and the error feedback; a different algorithm is off by whole units.
constexpr double kParityTolerance = 1e-4;

ddp::PowerSgdOptions options_from(const nlohmann::json& json) {
  ddp::PowerSgdOptions options;
  options.matrix_approximation_rank = json.at("matrix_approximation_rank");
  options.start_powersgd_iter = json.at("start_powerSGD_iter");
  options.min_compression_rate = json.at("min_compression_rate");
  options.use_error_feedback = json.at("use_error_feedback");
  options.warm_start = json.at("warm_start");
  options.orthogonalization_epsilon = json.at("orthogonalization_epsilon");
  options.random_seed = json.at("random_seed");
  return options;
}

// A bucket laid out as the fixture's: a flat buffer and a view per parameter shape. A hook sees the same buffer
// every iteration, as from the reducer.
ddp::GradBucket make_bucket(size_t index, const nlohmann::json& shapes) {
  ddp::GradBucket bucket{index, shapes.size(), {}, {}};
  const nlohmann::json& own = shapes[index];
  int64_t numel = 0;
  for (const auto& shape : own) numel += c10::multiply_integers(shape.get<std::vector<int64_t>>());
  bucket.buffer = torch::empty({numel});
  int64_t offset = 0;
  for (const auto& shape_json : own) {
    const auto shape = shape_json.get<std::vector<int64_t>>();
    bucket.gradients.push_back(bucket.buffer.narrow(0, offset, c10::multiply_integers(shape)).view(shape));
    offset += c10::multiply_integers(shape);
  }
  return bucket;
}

TEST(PowerSgdParityWorker, Run) {
  if (!is_worker_process()) GTEST_SKIP() << "runs only as a rank of PowerSgdParity";
  InitOptions init;
  init.backend = "gloo";
  init.device = "cpu";
  init.timeout = std::chrono::seconds(30);
  init_process_group(init);
  comm::Communicator& communicator = default_group().communicator();
  const nlohmann::json fixture = load_json_fixture("powersgd_pytorch.json");
  ASSERT_EQ(fixture["world_size"].get<int>(), world_size());
  const nlohmann::json& shapes = fixture["buckets"];
  for (const auto& config : fixture["configs"]) {
    ddp::CommHookPtr hook = ddp::make_powersgd_hook(options_from(config["options"]));
    std::vector<ddp::GradBucket> buckets;
    for (size_t b = 0; b < shapes.size(); ++b) buckets.push_back(make_bucket(b, shapes));
    double largest = 0;
    const auto& iterations = config["iterations"];
    for (size_t it = 0; it < iterations.size(); ++it) {
      for (size_t b = 0; b < buckets.size(); ++b) {
        const auto& expected = iterations[it][b];
        ddp::GradBucket& bucket = buckets[b];
        bucket.buffer.copy_(torch::tensor(expected["inputs"][rank()].get<std::vector<float>>()));
        hook->launch(communicator, bucket)->wait();
        const torch::Tensor want = torch::tensor(expected["output"].get<std::vector<float>>());
        const double difference = (bucket.buffer - want).abs().max().item<double>();
        largest = std::max(largest, difference);
        EXPECT_LE(difference, kParityTolerance * std::max(1.0, want.abs().max().item<double>()))
            << config["name"] << " iteration " << it << " bucket " << b;
      }
    }
    std::printf("[powersgd parity] %s rank %d: largest difference from PyTorch %.3g over %zu iterations (tolerance %g)\n",
                config["name"].get<std::string>().c_str(), rank(), largest, iterations.size(), kParityTolerance);
  }
  destroy_process_group();
}

TEST(PowerSgdParity, MatchesPyTorchsHookOnTwoProcesses) {
  const auto results = run_worker_ranks(2, "PowerSgdParityWorker.Run", std::chrono::seconds(90));
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_FALSE(results[r].timed_out) << "rank " << r << " hung:\n" << results[r].output;
    EXPECT_EQ(results[r].exit_code, 0) << "rank " << r << " output:\n" << results[r].output;
    for (size_t line = results[r].output.find("[powersgd parity]"); line != std::string::npos;
         line = results[r].output.find("[powersgd parity]", line + 1)) {
      std::printf("%s\n", results[r].output.substr(line, results[r].output.find('\n', line) - line).c_str());
    }
  }
}

TEST(PowerSgdOptions, RefusesWhatPyTorchRefuses) {
  ddp::PowerSgdOptions options;
  options.start_powersgd_iter = 1;
  EXPECT_THROW(ddp::make_powersgd_hook(options), InvalidArgument);
  options.use_error_feedback = false;
  options.warm_start = false;
  EXPECT_NO_THROW(ddp::make_powersgd_hook(options));
  options.matrix_approximation_rank = 0;
  EXPECT_THROW(ddp::make_powersgd_hook(options), InvalidArgument);
}

// Scenario's options hold one hook; PowerSGD's state is per model, so each rank makes its own.
std::vector<torch::Tensor> train_with_powersgd(Scenario s, int rank, comm::Communicator& communicator,
                                               const ddp::PowerSgdOptions& options) {
  s.options.comm_hook = ddp::make_powersgd_hook(options);
  return train_ddp(s, rank, borrow(communicator));
}

TEST(PowerSgdInDdp, AveragesPlainlyBeforeItsStartIteration) {
  Scenario s;
  s.steps = 4;
  const auto expected = train_reference(s);
  run_thread_ranks(2, [&](int rank, comm::Communicator& communicator) {
    ddp::PowerSgdOptions options;
    options.start_powersgd_iter = 100;
    const Difference d = compare(train_with_powersgd(s, rank, communicator, options), expected);
    EXPECT_LE(d.max_rel, 1e-5);
  });
}

// Compressed from the third iteration on, with several buckets and a parameter that is never used (the
// reducer's bookkeeping, which finds it, travels beside the compressed buckets): the replicas stay bit-identical,
// the unused parameter keeps its gradient, and training still lowers the loss.
TEST(PowerSgdInDdp, KeepsReplicasIdenticalAndTheTailIntact) {
  Scenario s;
  s.steps = 12;
  s.with_extra = true;
  s.options.find_unused_parameters = true;
  s.options.check_replicas_every = 1;
  s.options.bucket_cap_mb = 300.0 / (1024 * 1024);
  s.options.first_bucket_cap_mb = 100.0 / (1024 * 1024);
  std::vector<std::vector<torch::Tensor>> trained(2);
  run_thread_ranks(2, [&](int rank, comm::Communicator& communicator) {
    ddp::PowerSgdOptions options;
    options.start_powersgd_iter = 2;
    options.min_compression_rate = 1;
    trained[rank] = train_with_powersgd(s, rank, communicator, options);
  });
  const Difference between_ranks = compare(trained[1], trained[0]);
  EXPECT_EQ(between_ranks.max_abs, 0.0);
  // `extra` (the last two parameters) got no gradient anywhere, so SGD left it as rank 0 made it.
  const auto initial = snapshot(*make_net(s, 7));
  EXPECT_TRUE(torch::equal(trained[0].back(), initial.back()));
  const Difference from_reference = compare(trained[0], train_reference(s));
  std::printf("[powersgd in ddp] rank 1, 12 steps: largest relative difference from plain averaging %.3g\n",
              from_reference.max_rel);
  EXPECT_GT(from_reference.max_rel, 0.0);  // compressed gradients, so not the same trajectory...
  EXPECT_LT(from_reference.max_rel, 0.5);  // ...but not a different model either
}

// Error feedback and warm start off, so compression starts at once (PyTorch allows it): the first iteration is
// compressed in the first buckets, the next ones in the buckets DDP rebuilt in gradient order, which the hook
// must follow as the same model's.
TEST(PowerSgdInDdp, CompressesFromTheFirstIterationAcrossTheBucketRebuild) {
  Scenario s;
  s.steps = 6;
  s.options.check_replicas_every = 1;
  s.options.bucket_cap_mb = 300.0 / (1024 * 1024);
  s.options.first_bucket_cap_mb = 100.0 / (1024 * 1024);
  std::vector<std::vector<torch::Tensor>> trained(2);
  run_thread_ranks(2, [&](int rank, comm::Communicator& communicator) {
    ddp::PowerSgdOptions options;
    options.start_powersgd_iter = 0;
    options.use_error_feedback = false;
    options.warm_start = false;
    options.min_compression_rate = 1;
    trained[rank] = train_with_powersgd(s, rank, communicator, options);
  });
  EXPECT_EQ(compare(trained[1], trained[0]).max_abs, 0.0);
  const Difference from_reference = compare(trained[0], train_reference(s));
  EXPECT_GT(from_reference.max_rel, 0.0);  // compressed from the first step
  EXPECT_LT(from_reference.max_rel, 0.5);
}

TEST(PowerSgdInDdp, OneHookServesOneModel) {
  run_thread_ranks(2, [&](int rank, comm::Communicator& communicator) {
    ddp::PowerSgdOptions options;
    options.start_powersgd_iter = 2;
    ddp::CommHookPtr hook = ddp::make_powersgd_hook(options);
    torch::Tensor first = torch::ones({8, 8}), second = torch::ones({8, 8});
    const int first_model = 0, second_model = 0;
    for (int it = 0; it < 3; ++it) hook->launch(communicator, {0, 1, first.view({-1}), {first}, &first_model})->wait();
    try {
      hook->launch(communicator, {0, 1, second.view({-1}), {second}, &second_model})->wait();
      ADD_FAILURE() << "a second model's bucket was accepted";
    } catch (const InvalidArgument& error) {
      EXPECT_NE(std::string(error.what()).find("give each DistributedDataParallel its own"), std::string::npos)
          << error.what();
    }
  });
}

// What each hook hands to all-reduces for a bucket of a 64 x 32 matrix and a 32-element bias: the whole bucket
// (average), half of it (fp16), (64 + 32) * r elements plus the uncompressed bias (PowerSGD).
TEST(CommHookBytes, CountWhatEachHookAllReduces) {
  run_thread_ranks(2, [&](int rank, comm::Communicator& communicator) {
    auto bytes_for = [&](const ddp::CommHookPtr& hook) {
      torch::Tensor buffer = torch::randn({64 * 32 + 32});
      ddp::GradBucket bucket{0, 1, buffer, {buffer.narrow(0, 0, 64 * 32).view({64, 32}), buffer.narrow(0, 64 * 32, 32)}};
      const int64_t before = hook->bytes_all_reduced();
      hook->launch(communicator, bucket)->wait();
      return hook->bytes_all_reduced() - before;
    };
    EXPECT_EQ(bytes_for(ddp::make_average_hook()), (64 * 32 + 32) * 4);
    EXPECT_EQ(bytes_for(ddp::make_fp16_compress_hook()), (64 * 32 + 32) * 2);
    ddp::PowerSgdOptions options;
    options.matrix_approximation_rank = 2;
    options.start_powersgd_iter = 0;
    options.use_error_feedback = false;
    options.warm_start = false;
    EXPECT_EQ(bytes_for(ddp::make_powersgd_hook(options)), ((64 + 32) * 2 + 32) * 4);
  });
}

}  // namespace
}  // namespace tandem::testing
