// DDP as users run it: real processes joined through init_process_group, each wrapping its model with the
// default process group, must end with the parameters of one process trained on the whole batch.
#include <gtest/gtest.h>

#include <cstdlib>

#include "ddp_fixtures.h"
#include "support/processes.h"
#include "tandem/comm/process_group.h"

namespace tandem::testing {
namespace {

TEST(DdpProcessWorker, Run) {
  if (!is_worker_process()) GTEST_SKIP() << "runs only as a rank of DdpProcesses";
  InitOptions init;
  init.backend = "gloo";
  init.timeout = std::chrono::seconds(30);
  init_process_group(init);
  Scenario s;
  s.world = world_size();
  s.micro_batches = 2;
  s.options.bucket_cap_mb = 300.0 / (1024 * 1024);
  s.options.first_bucket_cap_mb = 100.0 / (1024 * 1024);
  Net net = make_net(s, 7 + rank());
  ddp::DistributedDataParallel<Net> model(net, s.options);
  auto optimizer = make_sgd(model.parameters());
  for (int step = 0; step < s.steps; ++step) {
    Batch batch = full_batch(s, step);
    optimizer.zero_grad();
    for (int k = 0; k < s.micro_batches; ++k) {
      const int64_t begin = (int64_t{k} * s.world + rank()) * s.batch_per_rank;
      auto x = batch.x.narrow(0, begin, s.batch_per_rank), y = batch.y.narrow(0, begin, s.batch_per_rank);
      if (k + 1 < s.micro_batches) {
        auto guard = model.no_sync();
        (torch::mse_loss(model(x), y) / s.micro_batches).backward();
      } else {
        (torch::mse_loss(model(x), y) / s.micro_batches).backward();
      }
    }
    optimizer.step();
  }
  const Difference d = compare(snapshot(*model.module()), train_reference(s));
  std::printf("[process parity] rank %d: largest difference abs %.3g relative %.3g\n", rank(), d.max_abs, d.max_rel);
  EXPECT_LE(d.max_rel, 1e-5);
  destroy_process_group();
}

TEST(DdpProcesses, MatchOneProcessOnTheWholeBatch) {
  auto results = run_worker_ranks(2, "DdpProcessWorker.Run", std::chrono::seconds(90));
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_FALSE(results[r].timed_out) << "rank " << r << " hung:\n" << results[r].output;
    EXPECT_EQ(results[r].exit_code, 0) << "rank " << r << " output:\n" << results[r].output;
    const auto line = results[r].output.find("[process parity]");
    if (line != std::string::npos) std::printf("%s\n", results[r].output.substr(line, results[r].output.find('\n', line) - line).c_str());
  }
}

}  // namespace
}  // namespace tandem::testing
