#include "bench/train/train_bench.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <optional>
#include <tuple>
#include <utility>

#include "bench/harness/rounds.h"
#include "tandem/comm/value_collectives.h"
#include "tandem/ddp/reducer.h"
#include "tandem/monitor/timeline_trace.h"
#include "tandem/nn/model_holder.h"
#include "tandem/nn/model_registry.h"
#include "tandem/train/parallel_strategy.h"
#include "tandem/util/compat.h"
#include "tandem/util/device.h"
#include "tandem/util/error.h"
#include "tandem/util/heap_retention.h"

namespace tandem::bench {
namespace {

using Clock = std::chrono::steady_clock;

// Batches of random data made before timing; the steps cycle through them.
constexpr int64_t kDataBatches = 16;

// The seeds' CNN reads grayscale images; every other registered model is an RGB network.
int64_t image_channels(const std::string& model) { return model == "cnn" ? 1 : 3; }

nn::ModelOptions model_shape(const TrainBenchOptions& options) {
  nn::ModelOptions shape;
  shape.in_channels = image_channels(options.model);
  shape.image_size = options.image_size;
  return shape;
}

int64_t replica_count(const TrainBenchOptions& options) {
  return std::max<int64_t>(1, static_cast<int64_t>(options.data_parallel_devices.size()));
}

double slowest_ms(double local_ms, const comm::CommunicatorPtr& communicator) {
  if (!communicator) return local_ms;
  torch::Tensor value = torch::tensor({local_ms}, torch::kFloat64);
  comm::all_reduce_values(*communicator, value, comm::ReduceOp::Max);
  return value.item<double>();
}

void check_one_wrapper(const TrainBenchOptions& options, const comm::CommunicatorPtr& communicator) {
  if (communicator && !options.data_parallel_devices.empty()) {
    throw InvalidArgument("the training benchmark runs DDP or DataParallel, not both at once");
  }
  if (options.fsdp && !options.data_parallel_devices.empty()) {
    throw InvalidArgument("the training benchmark runs FSDP or DataParallel, not both at once");
  }
}

// What train::Loop would be told to wrap the model as this benchmark does: FSDP or DDP (with its buckets and comm
// hook) across ranks, DataParallel over replicas. The comm hook is DDP's alone: the DataParallel run compared
// with a DDP run of another hook reduces as DataParallel always does.
train::LoopOptions loop_options_of(const TrainBenchOptions& options) {
  train::LoopOptions loop;
  loop.device = options.device;
  if (options.fsdp) {
    loop.strategy = train::Strategy::kFsdp;
    loop.fsdp = *options.fsdp;
  } else if (!options.data_parallel_devices.empty()) {
    loop.strategy = train::Strategy::kDataParallel;
    loop.dp_devices = options.data_parallel_devices;
  } else {
    loop.ddp = options.ddp;
    loop.comm_hook = options.comm_hook;
    loop.powersgd = options.powersgd;
  }
  return loop;
}

// kDataBatches batches of random images and labels on the device: each rank its own samples, as a sampler would
// give it.
std::pair<torch::Tensor, torch::Tensor> random_batches(const TrainBenchOptions& options, int64_t channels,
                                                       int64_t batch_size, int rank) {
  torch::manual_seed(static_cast<uint64_t>(options.seed) + 1 + static_cast<uint64_t>(rank));
  torch::Tensor images =
      torch::randn({kDataBatches * batch_size, channels, options.image_size, options.image_size}).to(options.device);
  torch::Tensor labels = torch::randint(0, 10, {kDataBatches * batch_size}, torch::kLong).to(options.device);
  return {images, labels};
}

// The timed repeats after the warm-up: ms per step of each, the slowest rank's, and their median and spread.
void time_repeats(const TrainBenchOptions& options, const comm::CommunicatorPtr& communicator,
                  const std::function<void(int, monitor::Timeline*)>& step, TrainBenchResult& result) {
  for (int r = 0; r < options.repeats; ++r) {
    synchronize(options.device);
    if (communicator) communicator->barrier()->wait();
    auto start = Clock::now();
    for (int i = 0; i < options.steps; ++i) step(options.warmup + r * options.steps + i, nullptr);
    synchronize(options.device);
    double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count() / options.steps;
    result.ms_per_step.push_back(slowest_ms(ms, communicator));
  }
  result.ms_median = median_of(result.ms_per_step);
  result.ms_min = *std::min_element(result.ms_per_step.begin(), result.ms_per_step.end());
  result.ms_max = *std::max_element(result.ms_per_step.begin(), result.ms_per_step.end());
}

// Of the gradient all-reduce, the share that ran while backward still computed, averaged over the ranks: one
// repeat of `options.steps` steps from step `first`, with `reducer` recording into a timeline. Collective.
double measure_hidden_share(ddp::Reducer& reducer, comm::Communicator& communicator, const TrainBenchOptions& options,
                            int first, const std::function<void(int, monitor::Timeline*)>& step) {
  monitor::Timeline timeline({1, options.steps});
  reducer.set_timeline(&timeline);
  for (int i = 0; i < options.steps; ++i) {
    timeline.begin_step(i + 1);
    step(first + i, &timeline);
    synchronize(options.device);
    timeline.end_step();
  }
  reducer.set_timeline(nullptr);
  torch::Tensor share = torch::tensor(
      {monitor::summarize_timeline(timeline.spans(), communicator.rank()).hidden_share()}, torch::kFloat64);
  comm::all_reduce_values(communicator, share, comm::ReduceOp::Sum);
  return share.item<double>() / communicator.world_size();
}

// One all-reduce (avg) of `parameters` float32 values alone, median of 20 after 3 untimed, the slowest rank's.
// Collective.
double measure_allreduce_ms(const comm::CommunicatorPtr& communicator, int64_t parameters, const torch::Device& device) {
  torch::Tensor flat = torch::zeros({parameters}, torch::TensorOptions(torch::kFloat32).device(device));
  for (int i = 0; i < 3; ++i) communicator->all_reduce(flat, comm::ReduceOp::Avg)->wait();
  std::vector<double> times;
  for (int i = 0; i < 20; ++i) {
    synchronize(device);
    auto start = Clock::now();
    communicator->all_reduce(flat, comm::ReduceOp::Avg)->wait();
    synchronize(device);
    times.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
  }
  return slowest_ms(median_of(times), communicator);
}

}  // namespace

void check_model_builds(const TrainBenchOptions& options) {
  try {
    nn::make_model(options.model, model_shape(options));
  } catch (const InvalidArgument& error) {
    throw InvalidArgument(fmt::format("--model {} at --image-size {}: {}; use a larger --image-size or another --model",
                                      options.model, options.image_size, error.what()));
  }
}

double train_data_bytes(const TrainBenchOptions& options) {
  const double samples = static_cast<double>(kDataBatches) * options.batch_size * replica_count(options);
  const double pixels = static_cast<double>(options.image_size) * static_cast<double>(options.image_size);
  return samples * (image_channels(options.model) * pixels * sizeof(float) + sizeof(int64_t));
}

TrainBenchResult run_train_bench(const TrainBenchOptions& options, const comm::CommunicatorPtr& communicator) {
  // DDP on the host keeps freed memory in the process; the independent and DataParallel runs it is compared
  // with do the same, so that scaling measures DDP, not the allocator.
  retain_freed_heap_memory();
  const int world = communicator ? communicator->world_size() : 1;
  const int rank = communicator ? communicator->rank() : 0;
  const auto& replica_devices = options.data_parallel_devices;
  check_one_wrapper(options, communicator);
  // What one step takes: the batch of all DataParallel replicas, and the learning rate scaled alike.
  const int64_t replicas = replica_count(options);
  const int64_t batch_size = options.batch_size * replicas;
  torch::manual_seed(static_cast<uint64_t>(options.seed));
  const nn::ModelOptions shape = model_shape(options);
  nn::ModelHolder model(nn::make_model(options.model, shape).module);
  (*model).to(options.device);
  torch::optim::SGD optimizer(
      (*model).parameters(),
      torch::optim::SGDOptions(options.lr * static_cast<double>(world * replicas)).momentum(0.9).weight_decay(0.005));
  // Across ranks or replicas, the model is wrapped as train::Loop wraps it; alone, it runs bare: the baseline
  // that scaling efficiency is measured against has nothing in between.
  const train::LoopOptions loop_options = loop_options_of(options);
  std::unique_ptr<train::ParallelStrategy> strategy;
  if (communicator || !replica_devices.empty()) {
    strategy = train::make_parallel_strategy(loop_options);
    strategy->validate(loop_options, world);
    strategy->wrap({loop_options, model, optimizer, communicator});
  }
  auto forward = [&](const torch::Tensor& x) { return strategy ? strategy->forward(x) : model->forward(x); };
  const auto optimizer_step = [&] {
    optimizer.step();
    return true;
  };
  ddp::Reducer* reducer = strategy ? strategy->reducer() : nullptr;

  torch::Tensor images, labels;
  std::tie(images, labels) = random_batches(options, shape.in_channels, batch_size, rank);

  // `timeline` null: no spans, no clock reads.
  auto step = [&](int i, monitor::Timeline* timeline) {
    int64_t start = (i % kDataBatches) * batch_size;
    torch::Tensor x = images.narrow(0, start, batch_size);
    torch::Tensor y = labels.narrow(0, start, batch_size);
    compat::drop_gradients(optimizer);  // as the PyTorch side's zero_grad(set_to_none=True)
    torch::Tensor loss;
    {
      monitor::TimelineSpan span(timeline, monitor::SpanKind::kForward);
      loss = torch::nn::functional::cross_entropy(forward(x), y);
    }
    {
      monitor::TimelineSpan span(timeline, monitor::SpanKind::kBackward);
      loss.backward();
    }
    monitor::TimelineSpan span(timeline, monitor::SpanKind::kOptimizer);
    if (strategy) {
      strategy->step(optimizer_step);
    } else {
      optimizer_step();
    }
  };

  for (int i = 0; i < options.warmup; ++i) step(i, nullptr);
  TrainBenchResult result;
  const int64_t bytes_before = reducer ? reducer->comm_hook().bytes_all_reduced() : 0;
  time_repeats(options, communicator, step, result);
  if (reducer) {
    result.bytes_per_step = static_cast<double>(reducer->comm_hook().bytes_all_reduced() - bytes_before) /
                            (options.repeats * options.steps);
  }
  // Under FSDP the module holds placeholders of the parameters' shapes: the count is the model's still.
  for (const auto& p : (*model).parameters()) result.parameters += p.numel();

  if (reducer && communicator) {
    // One more repeat, untimed, with a timeline: its clock reads must not touch the figures above.
    result.hidden_share = measure_hidden_share(*reducer, *communicator, options,
                                               options.warmup + options.repeats * options.steps, step);
  }
  if (communicator) result.allreduce_ms = measure_allreduce_ms(communicator, result.parameters, options.device);
  return result;
}

}  // namespace tandem::bench
