// A backward through the bare module (ddp.module(), PyTorch's `ddp.module`) bypasses DDP: after a few DDP steps
// rank 0 alone computes an input gradient through it (a saliency map, a probe). No gradient hook may reach the
// reducer then: no all-reduce that the other rank never joins (a hang, or Gloo aborting on mismatched sizes),
// and no reducer work at all. The DDP steps after it still match one process on the whole batch.
#include <gtest/gtest.h>

#include "ddp_fixtures.h"
#include "support/processes.h"
#include "tandem/comm/process_group.h"

namespace tandem::testing {
namespace {

constexpr int kProbeBeforeStep = 3;

TEST(BareModuleWorker, ProbeOnRankZero) {
  if (!is_worker_process()) GTEST_SKIP() << "runs only as a rank of BareModule";
  InitOptions init;
  init.backend = "gloo";
  init.timeout = std::chrono::seconds(10);
  init_process_group(init);
  Scenario s;
  s.world = world_size();
  s.steps = 8;
  s.options.check_replicas_every = 1;
  s.options.bucket_cap_mb = 300.0 / (1024 * 1024);
  s.options.first_bucket_cap_mb = 100.0 / (1024 * 1024);
  const ddp::CommHookPtr hook = ddp::make_average_hook();
  s.options.comm_hook = hook;
  Net net = make_net(s, /*seed=*/7 + rank());
  ddp::DistributedDataParallel<Net> model(net, default_group().communicator_ptr(), s.options);
  auto optimizer = make_sgd(model.parameters());
  for (int step = 0; step < s.steps; ++step) {
    if (step == kProbeBeforeStep && rank() == 0) {
      const int64_t bytes_before = hook->bytes_all_reduced();
      const int64_t backwards_before = model.reducer().synchronised_backwards();
      torch::Tensor probe = full_batch(s, 99).x.narrow(0, 0, 3).clone().requires_grad_(true);
      model.module()->forward(probe).sum().backward();
      ASSERT_TRUE(probe.grad().defined());
      EXPECT_GT(probe.grad().abs().sum().item<double>(), 0.0);
      EXPECT_EQ(hook->bytes_all_reduced(), bytes_before) << "the bare module's backward all-reduced gradients";
      EXPECT_EQ(model.reducer().synchronised_backwards(), backwards_before);
    }
    const Batch batch = full_batch(s, step);
    const int64_t begin = int64_t{rank()} * s.batch_per_rank;
    // Clears the probe's local contribution to .grad as well, as the wrapper's documentation asks.
    optimizer.zero_grad();
    torch::mse_loss(model(batch.x.narrow(0, begin, s.batch_per_rank)), batch.y.narrow(0, begin, s.batch_per_rank))
        .backward();
    optimizer.step();
  }
  const Difference d = compare(snapshot(*model.module()), train_reference(s));
  std::printf("[bare module] rank %d: largest difference from one process abs %.3g relative %.3g\n", rank(), d.max_abs,
              d.max_rel);
  EXPECT_LE(d.max_rel, 1e-5);
  destroy_process_group();
}

TEST(BareModule, BackwardOnOneRankStaysLocal) {
  const auto results = run_worker_ranks(2, "BareModuleWorker.ProbeOnRankZero", std::chrono::seconds(60));
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_FALSE(results[r].timed_out) << "rank " << r << " hung:\n" << results[r].output;
    EXPECT_EQ(results[r].exit_code, 0) << "rank " << r << " output:\n" << results[r].output;
  }
}

}  // namespace
}  // namespace tandem::testing
