#include "support/collective_checks.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <limits>
#include <thread>

namespace tandem::testing {

using comm::ReduceOp;

torch::Tensor rank_values(int rank, int64_t numel, torch::ScalarType dtype) {
  return (torch::arange(numel, torch::kFloat64) * 0.5 + (rank + 1)).to(dtype);
}

void check_all_collectives(int rank, comm::Communicator& comm, int64_t numel, torch::ScalarType dtype,
                           const torch::Device& device) {
  const int world = comm.world_size();
  const auto on_device = [&](const torch::Tensor& t) { return t.to(device); };
  const auto expected_for = [&](int r) { return rank_values(r, numel, dtype); };
  torch::Tensor sum = torch::zeros({numel}, dtype), max = expected_for(0), min = expected_for(0);
  for (int r = 0; r < world; ++r) {
    sum += expected_for(r);
    max = torch::max(max, expected_for(r));
    min = torch::min(min, expected_for(r));
  }

  struct Case {
    ReduceOp op;
    torch::Tensor expected;
  };
  for (const Case& c : {Case{ReduceOp::Sum, sum}, Case{ReduceOp::Avg, sum / world}, Case{ReduceOp::Min, min},
                        Case{ReduceOp::Max, max}}) {
    torch::Tensor tensor = on_device(rank_values(rank, numel, dtype));
    comm.all_reduce(tensor, c.op)->wait();
    EXPECT_TRUE(torch::allclose(tensor.cpu(), c.expected)) << "all_reduce " << comm::to_string(c.op) << " numel " << numel;
  }

  for (int root : {0, world - 1}) {
    torch::Tensor tensor = on_device(rank_values(rank, numel, dtype));
    comm.broadcast(tensor, root)->wait();
    EXPECT_TRUE(torch::equal(tensor.cpu(), expected_for(root))) << "broadcast from " << root << " numel " << numel;
  }

  std::vector<torch::Tensor> gathered(world);
  for (auto& out : gathered) out = torch::empty({numel}, torch::TensorOptions(dtype).device(device));
  comm.all_gather(gathered, on_device(rank_values(rank, numel, dtype)))->wait();
  for (int r = 0; r < world; ++r) EXPECT_TRUE(torch::equal(gathered[r].cpu(), expected_for(r))) << "all_gather slot " << r;

  // reduce_scatter needs equal chunks: each rank contributes world*numel elements.
  torch::Tensor input = on_device(rank_values(rank, numel * world, dtype));
  torch::Tensor output = torch::empty({numel}, torch::TensorOptions(dtype).device(device));
  comm.reduce_scatter(output, input, ReduceOp::Sum)->wait();
  torch::Tensor all = torch::zeros({numel * world}, dtype);
  for (int r = 0; r < world; ++r) all += rank_values(r, numel * world, dtype);
  EXPECT_TRUE(torch::allclose(output.cpu(), all.view({world, numel})[rank])) << "reduce_scatter numel " << numel;

  comm.barrier()->wait();
}

void check_average_edges(int rank, comm::Communicator& comm) {
  const int world = comm.world_size();
  // Every rank holds 3/4 of float32's largest value: the sum overflows, the average does not.
  const float large = 0.75f * std::numeric_limits<float>::max();
  torch::Tensor near_max = torch::full({1001}, large);
  comm.all_reduce(near_max, ReduceOp::Avg)->wait();
  EXPECT_TRUE(torch::all(near_max == large).item<bool>()) << "float32 average near the top of the range gave "
                                                          << near_max[0].item<float>();

  // Integers are averaged after the sum, in a step of its own; is_completed() must not come before it.
  torch::Tensor counts = torch::full({1001}, int64_t{10} * (rank + 1));
  comm::WorkPtr work = comm.all_reduce(counts, ReduceOp::Avg);
  const auto give_up = std::chrono::steady_clock::now() + comm.timeout();
  while (!work->is_completed()) {
    ASSERT_LT(std::chrono::steady_clock::now(), give_up) << "an integer average never completed";
    std::this_thread::yield();
  }
  const int64_t expected = int64_t{10} * world * (world + 1) / 2 / world;
  EXPECT_TRUE(torch::all(counts == expected).item<bool>())
      << "is_completed() was true while the tensor held " << counts[0].item<int64_t>() << ", not " << expected;
  work->wait();
}

}  // namespace tandem::testing
