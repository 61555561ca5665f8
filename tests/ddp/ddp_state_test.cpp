// What may and may not change DDP's per-iteration state: a forward under no-grad must leave it alone; a
// backward that stops half way, or fails to communicate, must make the model refuse further use (its
// collectives are out of step with the peers'); a rank whose backward reaches no parameter must give its peers
// a DDP error, not a timeout.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "ddp_fixtures.h"
#include "support/thread_ranks.h"
#include "tandem/util/error.h"

namespace tandem::testing {
namespace {

// True when `tensor` holds the same values on every rank.
bool same_on_every_rank(comm::Communicator& communicator, const torch::Tensor& tensor) {
  torch::Tensor largest = tensor.clone();
  torch::Tensor smallest = tensor.clone();
  communicator.all_reduce(largest, comm::ReduceOp::Max)->wait();
  communicator.all_reduce(smallest, comm::ReduceOp::Min)->wait();
  return torch::equal(largest, smallest);
}

TEST(DdpState, NoGradForwardBetweenForwardAndBackwardKeepsTheSync) {
  run_thread_ranks(2, [](int rank, comm::Communicator& communicator) {
    Scenario s;
    Net net = make_net(s, 7);
    ddp::DistributedDataParallel<Net> model(net, borrow(communicator), s.options);
    Batch batch = full_batch(s, 0);
    torch::Tensor x = batch.x.narrow(0, rank * 4, 4);
    torch::Tensor output = model(x);
    {
      torch::NoGradGuard no_grad;  // metrics, a teacher model, an EMA: nothing that backward will see
      model(x);
    }
    torch::mse_loss(output, batch.y.narrow(0, rank * 4, 4)).backward();
    // Each rank's data differs, so unsynchronised gradients differ too.
    EXPECT_TRUE(same_on_every_rank(communicator, net->fc1->weight.grad()));
  });
}

// Identity in forward; throws in backward when `armed`, as a bad kernel or a user's hook would.
struct FailInBackward : torch::autograd::Function<FailInBackward> {
  static torch::Tensor forward(torch::autograd::AutogradContext* context, torch::Tensor x, bool armed) {
    context->saved_data["armed"] = armed;
    return x.clone();
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* context,
                                                 torch::autograd::variable_list grads) {
    if (context->saved_data["armed"].toBool()) throw std::runtime_error("injected failure in backward");
    return {grads[0], torch::Tensor()};
  }
};

struct TwoLayersImpl : torch::nn::Module {
  TwoLayersImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(8, 8));
    fc2 = register_module("fc2", torch::nn::Linear(8, 4));
  }
  // fc2's gradients come first in backward, so their buckets are launched before the failure point.
  torch::Tensor forward(torch::Tensor x) { return fc2(FailInBackward::apply(fc1(x), fail_in_backward)); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  bool fail_in_backward = false;
};
TORCH_MODULE(TwoLayers);

TEST(DdpState, BackwardThatStopsHalfWayMakesEveryRankRefuseTheNextForward) {
  std::vector<std::string> backward_errors(2), forward_errors(2);
  run_thread_ranks(
      2,
      [&](int rank, comm::Communicator& communicator) {
        TwoLayers net;
        ddp::DdpOptions options;
        options.bucket_cap_mb = 1.0 / (1024 * 1024);  // every parameter its own bucket
        options.first_bucket_cap_mb = 1.0 / (1024 * 1024);
        ddp::DistributedDataParallel<TwoLayers> model(net, borrow(communicator), options);
        net->fail_in_backward = rank == 0;
        torch::Tensor x = torch::randn({4, 8});
        try {
          model(x).sum().backward();
        } catch (const std::exception& error) {
          backward_errors[rank] = error.what();
        }
        try {
          model(x);
        } catch (const CommError& error) {
          forward_errors[rank] = error.what();
        }
      },
      std::chrono::seconds(3));  // rank 1 waits this long for the buckets rank 0 never launched
  std::printf("[rank 0] %s\n[rank 1] %s\n", forward_errors[0].c_str(), forward_errors[1].c_str());
  EXPECT_NE(backward_errors[0].find("injected failure"), std::string::npos) << backward_errors[0];
  EXPECT_FALSE(backward_errors[1].empty());
  EXPECT_NE(forward_errors[0].find("out of step"), std::string::npos) << forward_errors[0];
  EXPECT_NE(forward_errors[1].find("all-reduce failed"), std::string::npos) << forward_errors[1];
}

// Returns the input's first four columns on ranks where `bypass` is set: a forward that uses no parameter.
struct BypassableImpl : torch::nn::Module {
  BypassableImpl() { fc = register_module("fc", torch::nn::Linear(8, 4)); }
  torch::Tensor forward(torch::Tensor x) { return bypass ? x.narrow(1, 0, 4) * 1.0 : fc(x); }
  torch::nn::Linear fc{nullptr};
  bool bypass = false;
};
TORCH_MODULE(Bypassable);

TEST(DdpState, RankWhoseBackwardReachesNoParameterGivesEveryRankADdpError) {
  std::vector<std::string> messages(2);
  run_thread_ranks(
      2,
      [&](int rank, comm::Communicator& communicator) {
        Bypassable net;
        ddp::DistributedDataParallel<Bypassable> model(net, borrow(communicator));
        net->bypass = rank == 1;
        torch::Tensor x = torch::randn({4, 8}).requires_grad_(true);
        try {
          model(x).sum().backward();
        } catch (const InvalidArgument& error) {
          messages[rank] = error.what();
        }
      },
      std::chrono::seconds(20));
  std::printf("[rank 0] %s\n[rank 1] %s\n", messages[0].c_str(), messages[1].c_str());
  EXPECT_NE(messages[0].find("ranks [1]"), std::string::npos) << messages[0];
  EXPECT_NE(messages[1].find("fc.weight"), std::string::npos) << messages[1];
}

}  // namespace
}  // namespace tandem::testing
