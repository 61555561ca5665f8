// DataParallel against one module on the whole batch: gradients (the input's too) and SGD steps with 2 and 3 CPU
// replicas, each a thread; BatchNorm's buffers as PyTorch keeps them; the caller's thread-local state in the
// replica threads; the errors. The GPU test runs the same code with CUDA devices and skips without a GPU.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <ATen/Parallel.h>
#include <torch/version.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "support/gpu.h"
#include "tandem/amp/autocast.h"
#include "tandem/dp/data_parallel.h"
#include "tandem/nn/cnn_net.h"
#include "tandem/util/error.h"

namespace tandem::testing {
namespace {

using dp::DataParallel;
using dp::DataParallelOptions;

// Convolution, BatchNorm and a linear layer: parameters in several layers, and running statistics.
struct BnNetImpl : torch::nn::Cloneable<BnNetImpl> {
  BnNetImpl() { reset(); }
  void reset() override {
    conv = register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 4, 3)));
    bn = register_module("bn", torch::nn::BatchNorm2d(4));
    fc = register_module("fc", torch::nn::Linear(4 * 6 * 6, 3));
  }
  torch::Tensor forward(const torch::Tensor& x) { return fc(torch::relu(bn(conv(x))).flatten(1)); }
  torch::nn::Conv2d conv{nullptr};
  torch::nn::BatchNorm2d bn{nullptr};
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(BnNet);

// A module held the way most LibTorch code writes one: not Cloneable, so DataParallel cannot copy it.
struct PlainNetImpl : torch::nn::Module {
  PlainNetImpl() { fc = register_module("fc", torch::nn::Linear(4, 2)); }
  torch::Tensor forward(const torch::Tensor& x) { return fc(x); }
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(PlainNet);

DataParallelOptions on_cpu(int replicas) { return {std::vector<torch::Device>(replicas, torch::kCPU), {}}; }

// A copy with the same values, trained alone on the whole batch as the reference.
template <typename Net>
Net copy_of(const Net& net) {
  return Net(std::dynamic_pointer_cast<typename Net::ContainedType>(net->clone()));
}

std::vector<torch::Tensor> gradients(torch::nn::Module& module) {
  std::vector<torch::Tensor> grads;
  for (const auto& p : module.parameters()) grads.push_back(p.grad().defined() ? p.grad().cpu() : torch::Tensor());
  return grads;
}

std::vector<torch::Tensor> values(torch::nn::Module& module) {
  std::vector<torch::Tensor> all;
  for (const auto& p : module.parameters()) all.push_back(p.detach().cpu().clone());
  for (const auto& b : module.buffers()) all.push_back(b.detach().cpu().to(torch::kFloat64));
  return all;
}

// The largest difference over all tensors, each relative to the largest magnitude in the expected tensor (so
// float32 rounding in entries near zero does not read as a large ratio). Fails the test on a missing tensor.
double largest_relative_difference(const std::vector<torch::Tensor>& got, const std::vector<torch::Tensor>& expected) {
  EXPECT_EQ(got.size(), expected.size());
  double largest = 0;
  for (size_t i = 0; i < std::min(got.size(), expected.size()); ++i) {
    EXPECT_TRUE(got[i].defined() && expected[i].defined()) << "tensor " << i << " has no value";
    if (!got[i].defined() || !expected[i].defined()) continue;
    const double scale = std::max(expected[i].abs().max().item<double>(), 1e-12);
    largest = std::max(largest, (got[i] - expected[i]).abs().max().item<double>() / scale);
  }
  return largest;
}

constexpr double kRelativeTolerance = 1e-5;

struct Split {
  int replicas;
  int64_t batch;
};
// For the test names CTest lists.
void PrintTo(const Split& split, std::ostream* out) {
  *out << split.replicas << " replicas, batch " << split.batch;
}

class DataParallelParity : public ::testing::TestWithParam<Split> {};

// The seeds' CNN: its parameter gradients and the input's equal one module's on the whole batch.
TEST_P(DataParallelParity, GradientsEqualOneModuleOnTheWholeBatch) {
  const Split split = GetParam();
  torch::manual_seed(1);
  nn::CnnNet net;
  nn::CnnNet reference = copy_of(net);
  torch::Tensor x = torch::randn({split.batch, 1, 28, 28});
  torch::Tensor y = torch::randint(0, 10, {split.batch}, torch::kLong);

  DataParallel model(net, on_cpu(split.replicas));
  torch::Tensor x_dp = x.clone().requires_grad_(true);
  torch::nn::functional::cross_entropy(model(x_dp), y).backward();
  torch::Tensor x_ref = x.clone().requires_grad_(true);
  torch::nn::functional::cross_entropy(reference(x_ref), y).backward();

  const double parameters = largest_relative_difference(gradients(model.module()), gradients(*reference));
  const double input = largest_relative_difference({x_dp.grad()}, {x_ref.grad()});
  std::printf("[dp parity] %d CPU replicas, batch %lld: largest relative difference %.3g (parameters), %.3g (input)"
              ", tolerance %.0e\n",
              split.replicas, static_cast<long long>(split.batch), parameters, input, kRelativeTolerance);
  EXPECT_LE(parameters, kRelativeTolerance);
  EXPECT_LE(input, kRelativeTolerance);
}

INSTANTIATE_TEST_SUITE_P(Splits, DataParallelParity,
                         ::testing::Values(Split{2, 8}, Split{3, 9}, Split{3, 7}, Split{3, 2}),
                         [](const auto& info) {
                           return std::to_string(info.param.replicas) + "ReplicasBatch" +
                                  std::to_string(info.param.batch);
                         });

// Five SGD steps with momentum: the copies are re-bound after each optimizer.step(), so training matches.
TEST(DataParallelTraining, SgdStepsMatchOneModule) {
  torch::manual_seed(2);
  nn::CnnNet net;
  nn::CnnNet reference = copy_of(net);
  DataParallel model(net, on_cpu(3));
  auto sgd = [](torch::nn::Module& m) {
    return torch::optim::SGD(m.parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  };
  torch::optim::SGD optimizer = sgd(model.module());
  torch::optim::SGD reference_optimizer = sgd(*reference);
  for (int step = 0; step < 5; ++step) {
    torch::Tensor x = torch::randn({10, 1, 28, 28});
    torch::Tensor y = torch::randint(0, 10, {10}, torch::kLong);
    optimizer.zero_grad();
    torch::nn::functional::cross_entropy(model(x), y).backward();
    optimizer.step();
    reference_optimizer.zero_grad();
    torch::nn::functional::cross_entropy(reference(x), y).backward();
    reference_optimizer.step();
  }
  const double difference = largest_relative_difference(values(model.module()), values(*reference));
  std::printf("[dp training] 3 CPU replicas, 5 SGD steps, batch 10: largest relative difference %.3g, tolerance %.0e\n",
              difference, kRelativeTolerance);
  EXPECT_LE(difference, kRelativeTolerance);
}

// As PyTorch: replica 0 works on the original's buffers, the copies' updates are lost. Batch 7 over 3 replicas
// gives replica 0 the rows 0..2.
TEST(DataParallelBuffers, TrainModeKeepsReplicaZerosRunningStatistics) {
  torch::manual_seed(3);
  BnNet net;
  BnNet replica_zero_alone = copy_of(net);
  torch::Tensor x = torch::randn({7, 1, 8, 8}) * 3 + 1;
  DataParallel model(net, on_cpu(3));
  model(x);
  replica_zero_alone(x.narrow(0, 0, 3));
  torch::nn::BatchNorm2d& alone = replica_zero_alone->bn;
  const double difference = largest_relative_difference({net->bn->running_mean, net->bn->running_var},
                                                        {alone->running_mean, alone->running_var});
  std::printf("[dp buffers] running statistics vs one module on replica 0's chunk: largest relative difference %.3g\n",
              difference);
  EXPECT_LE(difference, kRelativeTolerance);
  EXPECT_EQ(net->bn->num_batches_tracked.item<int64_t>(), 1);
}

// In eval mode every replica normalises with the original's running statistics, so the output is the module's.
TEST(DataParallelBuffers, EvalModeUsesTheOriginalsBuffers) {
  torch::manual_seed(4);
  BnNet net;
  DataParallel model(net, on_cpu(3));
  for (int i = 0; i < 3; ++i) model(torch::randn({6, 1, 8, 8}) * 2 + 1);  // running statistics away from 0 and 1
  net->eval();
  torch::Tensor x = torch::randn({8, 1, 8, 8});
  const torch::Tensor mean_before = net->bn->running_mean.clone();
  torch::NoGradGuard no_grad;
  const double difference = largest_relative_difference({model(x)}, {net(x)});
  std::printf("[dp buffers] eval mode, output vs the module's: largest relative difference %.3g\n", difference);
  EXPECT_LE(difference, kRelativeTolerance);
  EXPECT_TRUE(net->bn->running_mean.equal(mean_before));
}

// A module that records the thread-local state its forward ran under.
struct ProbeImpl : torch::nn::Cloneable<ProbeImpl> {
  ProbeImpl() { reset(); }
  void reset() override { fc = register_module("fc", torch::nn::Linear(4, 2)); }
  torch::Tensor forward(const torch::Tensor& x) {
    grad_mode_off += !torch::GradMode::is_enabled();
    intra_op_threads = at::get_num_threads();
    return fc(x);
  }
  torch::nn::Linear fc{nullptr};
  // static: one record for the module and all its copies.
  static inline std::atomic<int> grad_mode_off{0};
  static inline std::atomic<int> intra_op_threads{0};
};
TORCH_MODULE(Probe);

TEST(DataParallelThreads, GradModeAndInferenceModeReachTheReplicas) {
  Probe probe;
  DataParallel model(probe, on_cpu(3));
  const torch::Tensor x = torch::randn({6, 4});
  EXPECT_TRUE(model(x).requires_grad());
  ProbeImpl::grad_mode_off = 0;
  {
    torch::NoGradGuard no_grad;
    EXPECT_FALSE(model(x).requires_grad());
  }
  EXPECT_EQ(ProbeImpl::grad_mode_off.load(), 3);
  {
    c10::InferenceMode inference;
    EXPECT_TRUE(model(x).is_inference());
  }
  // Back in grad mode after inference mode: the copies are normal tensors again, and gradients reach the module.
  model(x).sum().backward();
  EXPECT_TRUE(probe->fc->weight.grad().defined());
}

// Autocast is per thread: the replicas must run under the caller's, dtype included. On 2.x the test uses float16,
// which is not the CPU's default autocast dtype, so only a carried-over dtype gives it.
TEST(DataParallelThreads, TheCallersAutocastAndItsDtypeReachTheReplicas) {
#if TORCH_VERSION_MAJOR >= 2
  const torch::ScalarType dtype = torch::kHalf;
#else
  const torch::ScalarType dtype = torch::kBFloat16;  // 1.13's CPU autocast has no other
#endif
  Probe probe;
  DataParallel model(probe, on_cpu(3));
  const torch::Tensor x = torch::randn({6, 4});
  torch::Tensor output;
  {
    amp::Autocast autocast(torch::kCPU, dtype);
    output = model(x);
  }
  // The join would have promoted one float32 replica's rows to float32.
  EXPECT_EQ(output.scalar_type(), dtype);
  EXPECT_EQ(model(x).scalar_type(), torch::kFloat32);
  output.to(torch::kFloat32).sum().backward();
  EXPECT_EQ(probe->fc->weight.grad().scalar_type(), torch::kFloat32);
}

TEST(DataParallel, ReplicaDevicesDefaultToTheThreadsOrTheVisibleGpus) {
  EXPECT_EQ(dp::replica_devices(torch::kCPU, 3), std::vector<torch::Device>(3, torch::kCPU));
  EXPECT_EQ(dp::replica_devices(torch::kCPU, 0).size(), static_cast<size_t>(std::max(1, at::get_num_threads())));
  const int visible = static_cast<int>(torch::cuda::device_count());
  EXPECT_EQ(dp::replica_devices(torch::Device(torch::kCUDA, 0), 0).size(), static_cast<size_t>(visible));
  EXPECT_THROW(dp::replica_devices(torch::Device(torch::kCUDA, 0), visible + 1), InvalidArgument);
}

TEST(DataParallelThreads, EachCpuReplicaGetsItsShareOfTheCallersThreads) {
  const int before = at::get_num_threads();
  at::set_num_threads(2);
  {
    Probe probe;
    DataParallel model(probe, on_cpu(2));
    int new_thread = 0;
    std::thread([&] { new_thread = at::get_num_threads(); }).join();
    model(torch::randn({4, 4}));
    std::printf("[dp threads] caller 2 intra-op threads: caller after %d, a new thread %d, a replica %d\n",
                at::get_num_threads(), new_thread, ProbeImpl::intra_op_threads.load());
    EXPECT_EQ(at::get_num_threads(), 2);
    EXPECT_EQ(new_thread, 2);
    EXPECT_EQ(ProbeImpl::intra_op_threads.load(), 1);
  }
  at::set_num_threads(before);
}

size_t threads_of_this_process() {
  size_t count = 0;
  for ([[maybe_unused]] const auto& task : std::filesystem::directory_iterator("/proc/self/task")) ++count;
  return count;
}

TEST(DataParallelThreads, DestructionJoinsEveryReplicaThread) {
  // One intra-op thread, so that no OpenMP team (whose threads end on their own time) comes or goes.
  const int before_threads = at::get_num_threads();
  at::set_num_threads(1);
  const size_t before = threads_of_this_process();
  size_t during = 0;
  {
    DataParallel model(Probe{}, on_cpu(3));
    model(torch::randn({6, 4})).sum().backward();
    during = threads_of_this_process();
  }
  const size_t after = threads_of_this_process();
  at::set_num_threads(before_threads);
  std::printf("[dp threads] process threads: %zu before, %zu with 3 replicas, %zu after\n", before, during, after);
  EXPECT_EQ(during, before + 3);
  EXPECT_EQ(after, before);
}

TEST(DataParallel, TakesEveryModelKindHoldModelTakes) {
  torch::manual_seed(5);
  const torch::Tensor x = torch::randn({5, 4});
  torch::NoGradGuard no_grad;
  torch::nn::Sequential sequential(torch::nn::Linear(4, 3), torch::nn::Tanh(), torch::nn::Linear(3, 2));
  EXPECT_TRUE(DataParallel(sequential, on_cpu(2))(x).allclose(sequential->forward(x)));
  auto shared = std::make_shared<ProbeImpl>();
  EXPECT_TRUE(DataParallel(shared, on_cpu(2))(x).allclose(shared->forward(x)));
  torch::nn::AnyModule any(Probe{});
  EXPECT_TRUE(DataParallel(any, on_cpu(2))(x).allclose(any.forward(x)));
}

template <typename Call>
std::string error_of(Call call) {
  try {
    call();
  } catch (const InvalidArgument& e) {
    return e.what();
  } catch (const Error& e) {
    return std::string("Error: ") + e.what();
  }
  return "no exception";
}

TEST(DataParallelErrors, EmptyDeviceList) {
  EXPECT_EQ(error_of([] { DataParallel(Probe{}, DataParallelOptions{}); }), "DataParallel needs at least one device");
}

TEST(DataParallelErrors, ModelThatCannotBeCopied) {
  const std::string not_cloneable = error_of([] { DataParallel(PlainNet{}, on_cpu(2)); });
  EXPECT_NE(not_cloneable.find("DataParallel copies the model onto each device after the first, but clone() has "
                               "not been implemented for"),
            std::string::npos)
      << not_cloneable;
  EXPECT_NE(not_cloneable.find("Cloneable"), std::string::npos) << not_cloneable;
  EXPECT_EQ(not_cloneable.find('\n'), std::string::npos) << not_cloneable;

  PlainNet plain;
  nn::ModelHolder bare(plain.ptr(), [plain](const torch::Tensor& x) mutable { return plain->forward(x); });
  const std::string bare_pair = error_of([&] { DataParallel(bare, on_cpu(2)); });
  EXPECT_NE(bare_pair.find("held as a bare (module, forward) pair"), std::string::npos) << bare_pair;
  // One device needs no copy.
  EXPECT_EQ(DataParallel(bare, on_cpu(1))(torch::randn({3, 4})).size(0), 3);
}

TEST(DataParallelErrors, EmptyBatchAndZeroDimInput) {
  DataParallel model(Probe{}, on_cpu(2));
  EXPECT_EQ(error_of([&] { model(torch::randn({0, 4})); }), "DataParallel got an empty batch (dim 0 has size 0)");
  EXPECT_EQ(error_of([&] { model(torch::tensor(1.0)); }),
            "DataParallel splits its input along dim 0, but got a 0-dim tensor");
}

// Throws from forward for a chunk of one row: batch 4 over 3 replicas gives chunks of 2, 1 and 1.
struct FailsOnOneRowImpl : torch::nn::Cloneable<FailsOnOneRowImpl> {
  FailsOnOneRowImpl() { reset(); }
  void reset() override {}
  torch::Tensor forward(const torch::Tensor& x) {
    if (x.size(0) == 1) throw InvalidArgument("one row is not enough");
    return x;
  }
};
TORCH_MODULE(FailsOnOneRow);

TEST(DataParallelErrors, ReplicaExceptionNamesTheReplicaAndDevice) {
  DataParallel model(FailsOnOneRow{}, on_cpu(3));
  EXPECT_EQ(error_of([&] { model(torch::randn({4, 2})); }),
            "Error: DataParallel replica 1 on cpu: one row is not enough");
  // The threads are still there for the next forward.
  EXPECT_EQ(model(torch::randn({6, 2})).size(0), 6);
}

// The same code path with CUDA devices: two GPUs where there are, else two replicas sharing GPU 0.
TEST(DataParallelOnGpu, GradientsEqualOneModuleOnTheWholeBatch) {
  TANDEM_SKIP_WITHOUT_GPU();
  const torch::Device gpu0(torch::kCUDA, 0);
  const torch::Device second(torch::kCUDA, visible_gpu_count() > 1 ? 1 : 0);
  torch::manual_seed(6);
  BnNet net;
  net->to(gpu0);
  BnNet reference = copy_of(net);
  torch::Tensor x = torch::randn({9, 1, 8, 8}, gpu0);
  torch::Tensor y = torch::randn({9, 3}, gpu0);
  // Eval mode: BatchNorm on running statistics, so the chunks do not each normalise with their own.
  net->eval();
  reference->eval();
  DataParallel model(net, {{gpu0, second}, {}});
  torch::mse_loss(model(x), y).backward();
  torch::mse_loss(reference(x), y).backward();
  const double difference = largest_relative_difference(gradients(*net), gradients(*reference));
  std::printf("[dp gpu] replicas on %s and %s: largest relative difference %.3g, tolerance 1e-4\n",
              gpu0.str().c_str(), second.str().c_str(), difference);
  EXPECT_LE(difference, 1e-4);
}

}  // namespace
}  // namespace tandem::testing
