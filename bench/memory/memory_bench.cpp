#include "bench/memory/memory_bench.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "bench/harness/rounds.h"
#include "tandem/ddp/distributed_data_parallel.h"
#include "tandem/fsdp/fully_sharded_data_parallel.h"
#include "tandem/nn/model_holder.h"
#include "tandem/nn/model_registry.h"
#include "tandem/util/compat.h"
#include "tandem/util/error.h"

namespace tandem::bench {
namespace {

// One layer of the wide MLP, y = x W + b with W stored [in, out]. Not torch::nn::Linear: LibTorch's linear saves
// weight.t(), a view that keeps a gathered FSDP unit alive until its backward (docs/fsdp.md, "Memory"), so an MLP
// of Linears would hold every layer gathered at the end of the forward. addmm saves W itself, which FSDP swaps
// back to its placeholder after the forward, as it does for convolutions.
struct DenseImpl : torch::nn::Module {
  DenseImpl(int64_t in, int64_t out) {
    torch::NoGradGuard no_grad;
    weight = register_parameter("weight", torch::randn({in, out}).mul_(1.0 / std::sqrt(static_cast<double>(in))));
    bias = register_parameter("bias", torch::zeros({out}));
  }
  torch::Tensor forward(const torch::Tensor& x) { return torch::addmm(bias, x, weight); }
  torch::Tensor weight, bias;
};
TORCH_MODULE(Dense);

// `layers` hidden layers of width x width with ReLU, then width -> 10 classes; each layer a direct child, so
// each is one FSDP unit.
struct WideMlpImpl : torch::nn::Module {
  explicit WideMlpImpl(const MlpShape& shape) {
    for (int64_t i = 0; i < shape.layers; ++i) {
      hidden.push_back(register_module(fmt::format("hidden{}", i), Dense(shape.width, shape.width)));
    }
    output = register_module("output", Dense(shape.width, 10));
  }
  torch::Tensor forward(torch::Tensor x) {
    for (auto& layer : hidden) x = torch::relu(layer->forward(x));
    return output->forward(x);
  }
  std::vector<Dense> hidden;
  Dense output{nullptr};
};
TORCH_MODULE(WideMlp);

nn::ModelHolder build_model(const MemoryBenchOptions& options) {
  if (options.model == "mlp") return nn::hold_model(WideMlp(mlp_shape(options.mlp_parameters, options.mlp_width)));
  nn::ModelOptions shape;
  shape.in_channels = 3;
  shape.image_size = options.image_size;
  return nn::ModelHolder(nn::make_model(options.model, shape).module);
}

// AdamW's two moments (and AMSGrad's maximum, where kept), the state that scales with the parameters; the step
// counts are a few bytes per tensor.
int64_t adamw_state_bytes(torch::optim::AdamW& optimizer) {
  int64_t bytes = 0;
  for (const auto& entry : optimizer.state()) {
    const auto& state = static_cast<const torch::optim::AdamWParamState&>(*entry.second);
    for (const torch::Tensor& tensor : {state.exp_avg(), state.exp_avg_sq(), state.max_exp_avg_sq()}) {
      if (tensor.defined()) bytes += tensor.numel() * static_cast<int64_t>(tensor.element_size());
    }
  }
  return bytes;
}

int64_t gradient_bytes(const std::vector<torch::Tensor>& parameters) {
  int64_t bytes = 0;
  for (const torch::Tensor& p : parameters) {
    if (p.grad().defined()) bytes += p.grad().numel() * static_cast<int64_t>(p.grad().element_size());
  }
  return bytes;
}

// Linux resets VmHWM to the current resident size on "5" written to clear_refs (since 4.0).
bool reset_peak_resident() {
  std::ofstream clear("/proc/self/clear_refs");
  clear << "5";
  clear.flush();
  return static_cast<bool>(clear);
}

}  // namespace

int64_t parse_parameter_count(const std::string& text) {
  constexpr int64_t kMost = 1'000'000'000'000;
  int64_t unit = 1;
  std::string digits = text;
  if (!digits.empty()) {
    const char last = static_cast<char>(std::toupper(static_cast<unsigned char>(digits.back())));
    unit = last == 'K' ? 1'000 : last == 'M' ? 1'000'000 : last == 'G' ? 1'000'000'000 : 1;
    if (unit > 1) digits.pop_back();
  }
  const bool whole = !digits.empty() && digits.size() <= 13 &&
                     std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; });
  const int64_t count = whole ? std::stoll(digits) : 0;
  if (count < 1 || count > kMost / unit) {
    throw InvalidArgument(fmt::format("'{}' is not a parameter count; give a whole number from 1 to 10^12, with K, M "
                                      "or G for 10^3, 10^6 or 10^9 (e.g. 600M)",
                                      text));
  }
  return count * unit;
}

MlpShape mlp_shape(int64_t parameters, int64_t width) {
  MlpShape shape{width, 1};
  const int64_t per_layer = width * width + width;
  if (shape.parameters() > parameters) {
    throw InvalidArgument(fmt::format("--mlp-params {} is less than one hidden layer of --mlp-width {} ({} "
                                      "parameters); give more parameters or a smaller width",
                                      parameters, width, shape.parameters()));
  }
  shape.layers = std::max<int64_t>(1, static_cast<int64_t>(std::llround(static_cast<double>(parameters) / per_layer)));
  return shape;
}

int64_t model_parameters(const MemoryBenchOptions& options) {
  if (options.model == "mlp") return mlp_shape(options.mlp_parameters, options.mlp_width).parameters();
  int64_t count = 0;
  for (const auto& p : (*build_model(options)).parameters()) count += p.numel();
  return count;
}

int64_t peak_resident_bytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  }
  return -1;
}

MemoryBenchResult run_memory_bench(const MemoryBenchOptions& options, const comm::CommunicatorPtr& communicator) {
  MemoryBenchResult result;
  result.rank = communicator ? communicator->rank() : 0;
  result.world_size = communicator ? communicator->world_size() : 1;
  const bool sharded = options.strategy == "fsdp";
  torch::manual_seed(options.seed);
  nn::ModelHolder model = build_model(options);
  for (const auto& p : (*model).parameters()) result.model_parameters += p.numel();

  std::optional<fsdp::FullyShardedDataParallel<nn::ModelHolder>> fully_sharded;
  std::optional<ddp::DistributedDataParallel<nn::ModelHolder>> distributed;
  if (sharded) {
    fsdp::FsdpOptions fsdp_options;
    fsdp_options.reshard_after_forward = options.reshard_after_forward;
    fully_sharded.emplace(model, communicator, fsdp_options);
  } else if (communicator) {
    distributed.emplace(model, communicator, ddp::DdpOptions{});
  }
  auto forward = [&](const torch::Tensor& x) {
    if (fully_sharded) return (*fully_sharded)(x);
    if (distributed) return (*distributed)(x);
    return model->forward(x);
  };
  const std::vector<torch::Tensor> trained = fully_sharded ? fully_sharded->parameters() : (*model).parameters();
  torch::optim::AdamW optimizer(trained, torch::optim::AdamWOptions(1e-4));
  result.peak_resident_build = peak_resident_bytes();
  const bool reset = reset_peak_resident();

  torch::manual_seed(options.seed + 1 + static_cast<uint64_t>(result.rank));
  const torch::Tensor x = options.model == "mlp"
                              ? torch::randn({options.batch_size, options.mlp_width})
                              : torch::randn({options.batch_size, 3, options.image_size, options.image_size});
  const torch::Tensor y = torch::randint(0, 10, {options.batch_size}, torch::kLong);
  std::vector<double> times;
  for (int step = 0; step < options.steps; ++step) {
    const auto start = std::chrono::steady_clock::now();
    compat::drop_gradients(optimizer);
    torch::nn::functional::cross_entropy(forward(x), y).backward();
    optimizer.step();
    times.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  }
  // Read before anything below allocates.
  result.peak_resident_train = reset ? peak_resident_bytes() : -1;
  if (times.size() > 1) times.erase(times.begin());  // the first step allocates the optimizer's state
  result.ms_per_step = median_of(times);

  result.gradient_bytes = gradient_bytes(trained);
  result.optimizer_state_bytes = adamw_state_bytes(optimizer);
  if (fully_sharded) {
    const fsdp::HeldBytes held = fully_sharded->sharded().held_bytes();
    result.parameter_bytes = held.shards;
    result.peak_gathered_bytes = fully_sharded->sharded().peak_unsharded_bytes();
    for (const auto& unit : fully_sharded->sharded().units()) {
      result.largest_unit_bytes = std::max(result.largest_unit_bytes, unit->unsharded_bytes());
    }
  } else {
    for (const torch::Tensor& p : trained) result.parameter_bytes += p.numel() * static_cast<int64_t>(p.element_size());
  }
  return result;
}

}  // namespace tandem::bench
