#include "support/collective_checks.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <limits>
#include <thread>
#include <utility>

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

void check_emulated_reductions(int rank, comm::Communicator& comm) {
  const int world = comm.world_size();
  // Rank r holds (r+1) + i*0.5 + i(r - i) at element i.
  const auto complex_values = [](int r) {
    torch::Tensor index = torch::arange(5, torch::kFloat64);
    return torch::complex(index * 0.5 + (r + 1), r - index);
  };
  torch::Tensor complex_sum = torch::zeros({5}, torch::kComplexDouble);
  for (int r = 0; r < world; ++r) complex_sum += complex_values(r);
  for (auto [op, expected] : {std::pair{ReduceOp::Sum, complex_sum}, std::pair{ReduceOp::Avg, complex_sum / world}}) {
    torch::Tensor values = complex_values(rank);
    comm.all_reduce(values, op)->wait();
    EXPECT_TRUE(torch::allclose(values, expected)) << "complex all_reduce " << comm::to_string(op);
  }
  torch::Tensor broadcast = complex_values(rank);
  comm.broadcast(broadcast, world - 1)->wait();
  EXPECT_TRUE(torch::equal(broadcast, complex_values(world - 1))) << "complex broadcast";
  std::vector<torch::Tensor> gathered(world);
  for (auto& out : gathered) out = torch::empty({5}, torch::kComplexDouble);
  comm.all_gather(gathered, complex_values(rank))->wait();
  for (int r = 0; r < world; ++r) {
    EXPECT_TRUE(torch::equal(gathered[r], complex_values(r))) << "complex all_gather " << r;
  }

  // Integers: 7, 14, ... averaged, truncating toward zero (negated: -7, -14, ...).
  int64_t integer_sum = 0;
  for (int r = 0; r < world; ++r) integer_sum += 7 * (r + 1);
  torch::Tensor counts = torch::tensor({7 * (rank + 1), -7 * (rank + 1)}, torch::kInt64);
  comm.all_reduce(counts, ReduceOp::Avg)->wait();
  EXPECT_EQ(counts[0].item<int64_t>(), integer_sum / world);
  EXPECT_EQ(counts[1].item<int64_t>(), -integer_sum / world);

  // Averaging reduce-scatters, in float, integers and complex: rank r contributes rank_values(r) (as integers,
  // its whole part), chunk c goes to rank c.
  const int64_t chunk = 3;
  for (auto dtype : {torch::kFloat32, torch::kInt32, torch::kComplexFloat}) {
    torch::Tensor all = torch::zeros({chunk * world}, dtype);
    for (int r = 0; r < world; ++r) all += rank_values(r, chunk * world, torch::kFloat64).to(dtype);
    torch::Tensor expected = dtype == torch::kInt32 ? all.div(world, "trunc") : all / world;
    const torch::Tensor input = rank_values(rank, chunk * world, torch::kFloat64).to(dtype);
    const torch::Tensor untouched = input.clone();
    torch::Tensor output = torch::empty({chunk}, dtype);
    comm.reduce_scatter(output, input, ReduceOp::Avg)->wait();
    EXPECT_TRUE(torch::allclose(output, expected.view({world, chunk})[rank])) << "reduce_scatter avg of " << dtype;
    EXPECT_TRUE(torch::equal(input, untouched)) << "reduce_scatter avg changed the input of " << dtype;
  }
}

}  // namespace tandem::testing
