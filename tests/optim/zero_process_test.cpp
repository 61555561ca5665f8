// DDP with ZeroRedundancyOptimizer as users run it: real processes joined through init_process_group train the
// DDP fixture model twice from the same start, once with a plain optimizer and once with the sharded one. The
// parameters must agree after every step, and each rank must hold only its share of the optimizer state.
#include <gtest/gtest.h>

#include <functional>

#include "ddp/ddp_fixtures.h"
#include "support/processes.h"
#include "tandem/comm/process_group.h"
#include "tandem/optim/state_bytes.h"
#include "tandem/optim/zero_redundancy_optimizer.h"

namespace tandem::testing {
namespace {

using MakeOptimizer = std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<torch::Tensor>)>;

struct Trajectory {
  std::vector<std::vector<torch::Tensor>> parameters;  // after each step
  std::unique_ptr<torch::optim::Optimizer> optimizer;
};

// DDP over the default group, each rank on its slice of each step's batch (ddp_fixtures.h).
Trajectory train(const Scenario& s, const MakeOptimizer& make_optimizer) {
  Net net = make_net(s, /*seed=*/7 + rank());
  ddp::DistributedDataParallel<Net> model(net, default_group().communicator_ptr(), s.options);
  Trajectory trajectory;
  trajectory.optimizer = make_optimizer(model.parameters());
  for (int step = 0; step < s.steps; ++step) {
    Batch batch = full_batch(s, step);
    const int64_t begin = int64_t{rank()} * s.batch_per_rank;
    trajectory.optimizer->zero_grad();
    torch::mse_loss(model(batch.x.narrow(0, begin, s.batch_per_rank)), batch.y.narrow(0, begin, s.batch_per_rank))
        .backward();
    trajectory.optimizer->step();
    trajectory.parameters.push_back(snapshot(*model.module()));
  }
  return trajectory;
}

template <typename OptimizerType, typename Options>
void check_against_plain(const char* name, const Options& options, bool frozen_fc1) {
  Scenario s;
  s.world = world_size();
  s.steps = 10;
  s.frozen_fc1 = frozen_fc1;
  const Trajectory plain =
      train(s, [&](std::vector<torch::Tensor> parameters) { return std::make_unique<OptimizerType>(parameters, options); });
  const Trajectory sharded = train(s, [&](std::vector<torch::Tensor> parameters) {
    return std::make_unique<optim::ZeroRedundancyOptimizer>(parameters, optim::make_optimizer<OptimizerType>(options),
                                                            default_group().communicator_ptr());
  });
  double largest = 0;
  for (int step = 0; step < s.steps; ++step) {
    largest = std::max(largest, compare(sharded.parameters[step], plain.parameters[step]).max_abs);
  }
  const auto& local = static_cast<optim::ZeroRedundancyOptimizer&>(*sharded.optimizer).local_optimizer();
  const int64_t share = optim::optimizer_state_bytes(local), whole = optim::optimizer_state_bytes(*plain.optimizer);
  std::printf("[zero process parity] %s%s, rank %d of %d: largest difference over %d steps %.3g (tolerance 1e-6); "
              "optimizer state %lld of %lld bytes\n",
              name, frozen_fc1 ? " (fc1 frozen)" : "", rank(), world_size(), s.steps, largest,
              static_cast<long long>(share), static_cast<long long>(whole));
  // Both runs reduce the same gradients and the owner runs the plain arithmetic: equal, in fact.
  EXPECT_LE(largest, 1e-6);
  EXPECT_LT(share, whole);
}

TEST(ZeroProcessWorker, Run) {
  if (!is_worker_process()) GTEST_SKIP() << "runs only as a rank of ZeroProcesses";
  InitOptions init;
  init.backend = "gloo";
  init.timeout = std::chrono::seconds(30);
  init_process_group(init);
  check_against_plain<torch::optim::SGD>("SGD momentum", torch::optim::SGDOptions(0.05).momentum(0.9), false);
  check_against_plain<torch::optim::Adam>("Adam", torch::optim::AdamOptions(1e-2), false);
  check_against_plain<torch::optim::Adam>("Adam", torch::optim::AdamOptions(1e-2).weight_decay(1e-2), true);
  destroy_process_group();
}

TEST(ZeroProcesses, DdpWithShardedSgdAndAdamFollowsThePlainTrajectory) {
  const std::vector<ProcessResult> results = run_worker_ranks(2, "ZeroProcessWorker.Run", std::chrono::seconds(90));
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_FALSE(results[r].timed_out) << "rank " << r << " hung:\n" << results[r].output;
    EXPECT_EQ(results[r].exit_code, 0) << "rank " << r << " output:\n" << results[r].output;
    for (size_t at = results[r].output.find("[zero process parity]"); at != std::string::npos;
         at = results[r].output.find("[zero process parity]", at + 1)) {
      std::printf("%s\n", results[r].output.substr(at, results[r].output.find('\n', at) - at).c_str());
    }
  }
}

}  // namespace
}  // namespace tandem::testing
