// DdpOptions::check_replicas_every: replicas that drift apart stop every rank with one error naming the step,
// the first tensor that differs and the ranks on each side; replicas that train in step pass every check.
#include <gtest/gtest.h>

#include <mutex>
#include <string>
#include <vector>

#include "ddp_fixtures.h"
#include "support/thread_ranks.h"
#include "tandem/util/error.h"

namespace tandem::testing {
namespace {

// One SGD step of `model` on this rank's slice of step `step`'s batch.
void train_step(ddp::DistributedDataParallel<Net>& model, torch::optim::SGD& optimizer, const Scenario& s, int rank,
                int step) {
  Batch batch = full_batch(s, step);
  optimizer.zero_grad();
  torch::mse_loss(model(batch.x.narrow(0, rank * s.batch_per_rank, s.batch_per_rank)),
                  batch.y.narrow(0, rank * s.batch_per_rank, s.batch_per_rank))
      .backward();
  optimizer.step();
}

TEST(ReplicaCheck, RanksThatTrainInStepPassEveryCheck) {
  run_thread_ranks(2, [](int rank, comm::Communicator& communicator) {
    Scenario s;
    s.options.check_replicas_every = 1;
    Net net = make_net(s, 7 + rank);
    ddp::DistributedDataParallel<Net> model(net, borrow(communicator), s.options);
    torch::optim::SGD optimizer = make_sgd(model.parameters());
    for (int step = 0; step < 5; ++step) train_step(model, optimizer, s, rank, step);
  });
}

// The drift that defect 1 caused (a no-grad forward between a forward and its backward turned that backward's
// all-reduce off): with the fix, the check stays silent; with the fix reverted, it is what stops training.
TEST(ReplicaCheck, NoGradForwardBeforeBackwardLeavesNothingToCatch) {
  run_thread_ranks(2, [](int rank, comm::Communicator& communicator) {
    Scenario s;
    s.options.check_replicas_every = 1;
    Net net = make_net(s, 7);
    ddp::DistributedDataParallel<Net> model(net, borrow(communicator), s.options);
    torch::optim::SGD optimizer = make_sgd(model.parameters());
    Batch batch = full_batch(s, 0);
    torch::Tensor x = batch.x.narrow(0, rank * 4, 4);
    torch::Tensor output = model(x);
    {
      torch::NoGradGuard no_grad;
      model(x);
    }
    torch::mse_loss(output, batch.y.narrow(0, rank * 4, 4)).backward();
    optimizer.step();
    model(x);  // synchronised forward 2: the check
  });
}

TEST(ReplicaCheck, RankThatChangedItsWeightsAloneStopsEveryRankNamingItAndTheStep) {
  std::mutex mutex;
  std::vector<std::string> errors(3);
  run_thread_ranks(3, [&](int rank, comm::Communicator& communicator) {
    Scenario s;
    s.world = 3;
    s.options.check_replicas_every = 2;
    Net net = make_net(s, 7);
    ddp::DistributedDataParallel<Net> model(net, borrow(communicator), s.options);
    torch::optim::SGD optimizer = make_sgd(model.parameters());
    train_step(model, optimizer, s, rank, 0);  // synchronised forward 1: no check yet
    if (rank == 1) {
      torch::NoGradGuard no_grad;
      net->fc2->bias[0].add_(1e-6);
    }
    try {
      train_step(model, optimizer, s, rank, 1);  // synchronised forward 2: checked
    } catch (const ReplicaDivergenceError& error) {
      std::lock_guard<std::mutex> lock(mutex);
      errors[rank] = error.what();
    }
  });
  for (const std::string& error : errors) {
    std::printf("%s\n", error.c_str());
    EXPECT_NE(error.find("at synchronised forward 2"), std::string::npos) << error;
    EXPECT_NE(error.find("first in 'fc2.bias'"), std::string::npos) << error;
    EXPECT_NE(error.find("ranks [0, 2] have"), std::string::npos) << error;
    EXPECT_NE(error.find("ranks [1] have"), std::string::npos) << error;
  }
}

TEST(ReplicaCheck, ForwardsUnderNoSyncAreNotCounted) {
  run_thread_ranks(2, [](int rank, comm::Communicator& communicator) {
    Scenario s;
    s.options.check_replicas_every = 2;
    Net net = make_net(s, 7);
    ddp::DistributedDataParallel<Net> model(net, borrow(communicator), s.options);
    Batch batch = full_batch(s, 0);
    torch::Tensor x = batch.x.narrow(0, rank * 4, 4);
    model(x);  // synchronised forward 1
    // Rank 1 alone runs extra forwards under no_sync: were they counted, only rank 1 would reach the check's
    // collective at the next forward, and the ranks would fall out of step.
    if (rank == 1) {
      auto guard = model.no_sync();
      model(x);
      model(x);
    }
    {
      torch::NoGradGuard no_grad;
      net->fc1->weight.fill_(0.5);  // the same change on both ranks: nothing to catch
    }
    EXPECT_NO_THROW(model(x));  // synchronised forward 2 on both ranks
  });
}

}  // namespace
}  // namespace tandem::testing
