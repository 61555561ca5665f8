#include "bench/overhead/overhead_bench.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <optional>

#include "bench/harness/rounds.h"
#include "tandem/comm/value_collectives.h"
#include "tandem/ddp/distributed_data_parallel.h"
#include "tandem/util/compat.h"

namespace tandem::bench {
namespace {

using Clock = std::chrono::steady_clock;

// The batches cycle through a few made before timing, as a loader's would.
constexpr int64_t kOverheadBatches = 4;

double slowest(double local, const comm::CommunicatorPtr& communicator) {
  if (!communicator || communicator->world_size() == 1) return local;
  torch::Tensor value = torch::tensor({local}, torch::kFloat64);
  comm::all_reduce_values(*communicator, value, comm::ReduceOp::Max);
  return value.item<double>();
}

// The all-reduce a DDP step of this model makes, alone: one buffer of every gradient, averaged.
double allreduce_latency_us(const comm::CommunicatorPtr& communicator, int64_t elements) {
  torch::Tensor flat = torch::zeros({elements});
  for (int i = 0; i < 50; ++i) communicator->all_reduce(flat, comm::ReduceOp::Avg)->wait();
  std::vector<double> times;
  for (int i = 0; i < 500; ++i) {
    const auto start = Clock::now();
    communicator->all_reduce(flat, comm::ReduceOp::Avg)->wait();
    times.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count());
  }
  return slowest(median_of(times), communicator);
}

}  // namespace

OverheadBenchResult run_overhead_bench(const OverheadBenchOptions& options, const comm::CommunicatorPtr& communicator) {
  const int rank = communicator ? communicator->rank() : 0;
  torch::manual_seed(0);
  torch::nn::Sequential model(torch::nn::Linear(kOverheadInputs, kOverheadHidden), torch::nn::ReLU(),
                              torch::nn::Linear(kOverheadHidden, kOverheadClasses));
  std::optional<ddp::DistributedDataParallel<torch::nn::Sequential>> distributed;
  if (communicator) distributed.emplace(model, communicator);
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));

  torch::manual_seed(1 + static_cast<uint64_t>(rank));
  const torch::Tensor inputs = torch::randn({kOverheadBatches * options.batch_size, kOverheadInputs});
  const torch::Tensor labels = torch::randint(0, kOverheadClasses, {kOverheadBatches * options.batch_size});
  auto step = [&](int i) {
    const int64_t start = (i % kOverheadBatches) * options.batch_size;
    const torch::Tensor x = inputs.narrow(0, start, options.batch_size);
    const torch::Tensor y = labels.narrow(0, start, options.batch_size);
    compat::drop_gradients(optimizer);  // as the PyTorch side's zero_grad(set_to_none=True)
    torch::Tensor output = distributed ? (*distributed)(x) : model->forward(x);
    torch::nn::functional::cross_entropy(output, y).backward();
    optimizer.step();
  };

  for (int i = 0; i < options.warmup; ++i) step(i);
  OverheadBenchResult result;
  for (int r = 0; r < options.repeats; ++r) {
    if (communicator) communicator->barrier()->wait();
    const auto start = Clock::now();
    for (int i = 0; i < options.steps; ++i) step(options.warmup + r * options.steps + i);
    const double us = std::chrono::duration<double, std::micro>(Clock::now() - start).count() / options.steps;
    result.us_per_step.push_back(slowest(us, communicator));
  }
  result.us_median = median_of(result.us_per_step);
  if (communicator) {
    int64_t elements = 0;
    for (const auto& parameter : model->parameters()) elements += parameter.numel();
    result.allreduce_us = allreduce_latency_us(communicator, elements);
  }
  return result;
}

}  // namespace tandem::bench
