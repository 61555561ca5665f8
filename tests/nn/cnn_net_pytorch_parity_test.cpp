// The seeds' CNN under tandem's DDP follows PyTorch's DDP step for step (tests/fixtures/cnn_ddp_pytorch.json, made
// by make_cnn_ddp_fixture.py): whatever layouts and kernels CnnNet's forward picks for speed (channels-last
// oneDNN convolutions, the classifier as convolutions, ReLU after the pool), the mathematics is PyTorch's.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "support/json_fixture.h"
#include "support/thread_ranks.h"
#include "tandem/ddp/distributed_data_parallel.h"
#include "tandem/nn/cnn_net.h"

namespace tandem::testing::cnn_pytorch_parity {
namespace {

// Float32 sums in another order than PyTorch's kernels (oneDNN against the reference BLAS), over 30 steps of
// momentum SGD at tandem train's default rate.
constexpr double kTolerance = 1e-4;

// The fixture's formulas, with the same LibTorch calls: parameter `index` in state-dict order, and a step's batch.
torch::Tensor initial_value(const std::vector<int64_t>& shape, int64_t index) {
  const int64_t numel = c10::multiply_integers(shape);
  const double scale = shape.size() == 1 ? 0.1 : 1.0 / std::sqrt(static_cast<double>(numel / shape[0]));
  return torch::arange(numel, torch::kFloat64).mul(0.37).add(index).sin().mul(scale).to(torch::kFloat32).reshape(shape);
}

std::pair<torch::Tensor, torch::Tensor> step_batch(int64_t step, int64_t rows) {
  torch::Tensor x = torch::arange(rows * 28 * 28, torch::kFloat64).mul(0.0137).add(1.3 * step).sin().to(torch::kFloat32);
  x = x.reshape({rows, 1, 28, 28}).mul(0.5);
  torch::Tensor y = x.reshape({rows, -1}).slice(1, 0, c10::nullopt, 97).sum(1).mul(2).floor().remainder(10).to(torch::kLong);
  return {x, y};
}

struct Trajectory {
  std::vector<double> losses;
  // Every sample_every-th element of each parameter, at the start and at the end.
  std::map<std::string, torch::Tensor> initial, final;
};

std::map<std::string, torch::Tensor> sampled(const torch::nn::Module& net, int64_t every) {
  std::map<std::string, torch::Tensor> samples;
  for (const auto& item : net.named_parameters()) {
    samples[item.key()] = item.value().detach().flatten().slice(0, 0, c10::nullopt, every).to(torch::kFloat64);
  }
  return samples;
}

Trajectory train_rank(int rank, comm::Communicator& communicator, const nlohmann::json& fixture) {
  const int64_t batch = fixture.at("batch_per_rank"), every = fixture.at("sample_every");
  nn::CnnNet net;
  {
    torch::NoGradGuard no_grad;
    int64_t index = 0;
    for (auto& p : net->parameters()) p.copy_(initial_value(p.sizes().vec(), index++));
  }
  ddp::DistributedDataParallel<nn::CnnNet> model(net, comm::CommunicatorPtr(&communicator, [](comm::Communicator*) {}),
                                                 ddp::DdpOptions{});
  torch::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(fixture.at("lr").get<double>())
                                                     .momentum(fixture.at("momentum").get<double>())
                                                     .weight_decay(fixture.at("weight_decay").get<double>()));
  Trajectory trajectory;
  trajectory.initial = sampled(*net, every);
  for (int64_t step = 0; step < fixture.at("steps").get<int64_t>(); ++step) {
    auto [x, y] = step_batch(step, batch * communicator.world_size());
    optimizer.zero_grad();
    torch::Tensor loss = torch::cross_entropy_loss(model(x.narrow(0, rank * batch, batch)), y.narrow(0, rank * batch, batch));
    loss.backward();
    optimizer.step();
    trajectory.losses.push_back(loss.item<double>());
  }
  trajectory.final = sampled(*net, every);
  return trajectory;
}

TEST(CnnNetPytorchParity, ThirtyDdpStepsFollowPytorchsTrajectory) {
  const nlohmann::json fixture = load_json_fixture("cnn_ddp_pytorch.json");
  torch::set_num_threads(1);
  Trajectory rank0;
  run_thread_ranks(fixture.at("world_size").get<int>(), [&](int rank, comm::Communicator& communicator) {
    Trajectory trajectory = train_rank(rank, communicator, fixture);
    if (rank == 0) rank0 = std::move(trajectory);
  });
  const auto expected_losses = fixture.at("losses").get<std::vector<double>>();
  ASSERT_EQ(rank0.losses.size(), expected_losses.size());
  double worst_loss = 0;
  for (size_t step = 0; step < expected_losses.size(); ++step) {
    worst_loss = std::max(worst_loss, std::abs(rank0.losses[step] - expected_losses[step]) / std::abs(expected_losses[step]));
  }
  // Each parameter's distance travelled, compared to PyTorch's: relative to how far it moved, not to its size,
  // so that a parameter that barely moved cannot hide a difference.
  double worst_parameter = 0;
  for (const auto& [name, expected_json] : fixture.at("parameters").items()) {
    ASSERT_TRUE(rank0.final.count(name)) << name;
    const torch::Tensor& start = rank0.initial.at(name);
    const torch::Tensor expected = torch::tensor(expected_json.get<std::vector<double>>(), torch::kFloat64) - start;
    const torch::Tensor got = rank0.final.at(name) - start;
    ASSERT_EQ(got.numel(), expected.numel()) << name;
    worst_parameter = std::max(worst_parameter, (got - expected).abs().max().item<double>() /
                                                    std::max(expected.abs().max().item<double>(), 1e-12));
  }
  std::printf("[cnn parity] largest relative difference from PyTorch over %zu steps: loss %.3g, parameters %.3g\n",
              expected_losses.size(), worst_loss, worst_parameter);
  EXPECT_LT(worst_loss, kTolerance);
  EXPECT_LT(worst_parameter, kTolerance);
}

}  // namespace
}  // namespace tandem::testing::cnn_pytorch_parity
