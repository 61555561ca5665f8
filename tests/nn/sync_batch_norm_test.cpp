// SyncBatchNorm's parity with BatchNorm: on N ranks (threads, real Gloo) holding UNEQUAL batches, outputs,
// input gradients, summed weight/bias gradients and running statistics equal those of one BatchNorm on the
// concatenated batch; a world of one is BatchNorm exactly; eval mode communicates nothing; conversion keeps
// names, values and the very tensors.
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <algorithm>
#include <mutex>
#include <numeric>

#include "support/gpu.h"
#include "support/processes.h"
#include "support/thread_ranks.h"
#include "tandem/comm/process_group.h"
#include "tandem/nn/sync_batch_norm.h"
#include "tandem/util/error.h"

namespace tandem {
namespace {

using torch::Tensor;

// The tests' communicators live on the stack of run_thread_ranks; SyncBatchNorm takes shared ownership.
comm::CommunicatorPtr borrow(comm::Communicator& communicator) {
  return comm::CommunicatorPtr(&communicator, [](comm::Communicator*) {});
}

// A world of two whose every collective fails: proves that a code path communicates nothing.
class NoCommunication : public comm::Communicator {
 public:
  NoCommunication()
      : Communicator("none", c10::make_intrusive<c10d::HashStore>(), 0, 2, std::chrono::seconds(1), Capabilities{}) {}

 protected:
  comm::WorkPtr start_all_reduce(Tensor&, comm::ReduceOp) override { throw CommError("all_reduce called"); }
  comm::WorkPtr start_broadcast(Tensor&, int) override { throw CommError("broadcast called"); }
  comm::WorkPtr start_all_gather(std::vector<Tensor>&, const Tensor&) override { throw CommError("all_gather called"); }
  comm::WorkPtr start_barrier() override { throw CommError("barrier called"); }
};

double max_diff(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.sizes(), b.sizes());
  return a.numel() == 0 ? 0.0 : (a - b).abs().max().item<double>();
}

struct ParityCase {
  std::vector<int64_t> batch_sizes;  // one per rank
  std::vector<int64_t> trailing;     // spatial dims after [N, C]: {} is 1d on [N, C], {H, W} is 2d
};
void PrintTo(const ParityCase& c, std::ostream* out) {
  *out << "batches " << ::testing::PrintToString(c.batch_sizes) << " spatial " << ::testing::PrintToString(c.trailing);
}

class SyncBatchNormParity : public ::testing::TestWithParam<ParityCase> {};

TEST_P(SyncBatchNormParity, EqualsBatchNormOnConcatenatedBatch) {
  const ParityCase param = GetParam();
  const int world = static_cast<int>(param.batch_sizes.size());
  const int64_t channels = 4;
  const int64_t total = std::accumulate(param.batch_sizes.begin(), param.batch_sizes.end(), int64_t{0});
  std::vector<int64_t> offsets{0};
  for (int64_t n : param.batch_sizes) offsets.push_back(offsets.back() + n);
  std::vector<int64_t> shape{total, channels};
  shape.insert(shape.end(), param.trailing.begin(), param.trailing.end());

  // Two training steps (running stats chain through the momentum), inputs with a channel offset and scale so
  // that mean and variance matter; `loss_weights` make every output element's gradient different.
  torch::manual_seed(7);
  std::vector<Tensor> inputs, loss_weights;
  for (int step = 0; step < 2; ++step) {
    inputs.push_back(torch::randn(shape) * 3 + 5);
    loss_weights.push_back(torch::randn(shape));
  }
  const Tensor weight = torch::rand({channels}) + 0.5, bias = torch::randn({channels});

  torch::nn::BatchNorm2d reference_2d(nullptr);
  torch::nn::BatchNorm1d reference_1d(nullptr);
  auto make_reference = [&]() -> torch::nn::Module& {
    if (param.trailing.empty()) {
      reference_1d = torch::nn::BatchNorm1d(channels);
      return *reference_1d;
    }
    reference_2d = torch::nn::BatchNorm2d(channels);
    return *reference_2d;
  };
  torch::nn::Module& reference = make_reference();
  {
    torch::NoGradGuard no_grad;
    reference.named_parameters()["weight"].copy_(weight);
    reference.named_parameters()["bias"].copy_(bias);
  }
  std::vector<Tensor> ref_out, ref_grad_in;
  Tensor ref_grad_weight, ref_grad_bias;
  for (int step = 0; step < 2; ++step) {
    Tensor x = inputs[step].clone().requires_grad_(true);
    Tensor y = nn::forward_batch_norm(reference, x);
    (y * loss_weights[step]).sum().backward();
    ref_out.push_back(y.detach());
    ref_grad_in.push_back(x.grad());
  }
  // Gradients accumulated over both steps, as the ranks' will be.
  ref_grad_weight = reference.named_parameters()["weight"].grad();
  ref_grad_bias = reference.named_parameters()["bias"].grad();
  const Tensor ref_running_mean = reference.named_buffers()["running_mean"];
  const Tensor ref_running_var = reference.named_buffers()["running_var"];

  std::mutex mutex;
  std::vector<double> worst(6, 0.0);  // output, input grad, weight grad, bias grad, running mean, running var
  std::vector<int64_t> batches_tracked(world, -1);
  testing::run_thread_ranks(world, [&](int rank, comm::Communicator& communicator) {
    nn::SyncBatchNorm layer(channels, borrow(communicator));
    {
      torch::NoGradGuard no_grad;
      layer->weight.copy_(weight);
      layer->bias.copy_(bias);
    }
    std::vector<double> diffs(6, 0.0);
    for (int step = 0; step < 2; ++step) {
      const Tensor slice_in = inputs[step].slice(0, offsets[rank], offsets[rank + 1]);
      Tensor x = slice_in.clone().requires_grad_(true);
      Tensor y = layer(x);
      (y * loss_weights[step].slice(0, offsets[rank], offsets[rank + 1])).sum().backward();
      diffs[0] = std::max(diffs[0], max_diff(y, ref_out[step].slice(0, offsets[rank], offsets[rank + 1])));
      diffs[1] = std::max(diffs[1], max_diff(x.grad(), ref_grad_in[step].slice(0, offsets[rank], offsets[rank + 1])));
    }
    // Each rank holds its share of the weight and bias gradients; their sum is BatchNorm's.
    Tensor grad_weight = layer->weight.grad().clone(), grad_bias = layer->bias.grad().clone();
    communicator.all_reduce(grad_weight, comm::ReduceOp::Sum)->wait();
    communicator.all_reduce(grad_bias, comm::ReduceOp::Sum)->wait();
    diffs[2] = max_diff(grad_weight, ref_grad_weight);
    diffs[3] = max_diff(grad_bias, ref_grad_bias);
    diffs[4] = max_diff(layer->running_mean, ref_running_mean);
    diffs[5] = max_diff(layer->running_var, ref_running_var);
    std::lock_guard<std::mutex> lock(mutex);
    for (size_t i = 0; i < worst.size(); ++i) worst[i] = std::max(worst[i], diffs[i]);
    batches_tracked[rank] = layer->num_batches_tracked.item<int64_t>();
  });

  const char* names[] = {"output", "input grad", "weight grad", "bias grad", "running_mean", "running_var"};
  for (size_t i = 0; i < worst.size(); ++i) {
    std::cout << "[ largest difference ] " << names[i] << ": " << worst[i] << "\n";
    EXPECT_LT(worst[i], 1e-5) << names[i];
  }
  for (int r = 0; r < world; ++r) EXPECT_EQ(batches_tracked[r], 2) << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(UnequalBatches, SyncBatchNormParity,
                         ::testing::Values(ParityCase{{3, 5}, {3, 2}}, ParityCase{{4, 1, 6}, {2, 3}},
                                           ParityCase{{7, 2, 3}, {}}, ParityCase{{5, 0, 3}, {2, 2}}));

// The same parity with the inputs on the GPU and the statistics reduced there (nccl with one GPU per rank, else
// gloo with CUDA tensors on one shared GPU): two ranks, real processes, with unequal batches, against
// BatchNorm2d on the concatenated batch.
TEST(SyncBatchNormOnGpuWorker, Run) {
  if (!testing::is_worker_process()) GTEST_SKIP() << "runs only as a rank of SyncBatchNormOnGpu";
  InitOptions init;
  init.device = "cuda";
  init.backend = testing::gpu_test_backend(2);
  init.timeout = std::chrono::seconds(60);
  init_process_group(init);
  const int rank = tandem::rank();
  const torch::Device device = default_group().device();
  torch::manual_seed(11);
  const std::vector<int64_t> offsets{0, 3, 8};
  const Tensor input = torch::randn({8, 4, 3, 2}) * 3 + 5, loss_weights = torch::randn({8, 4, 3, 2});
  torch::nn::BatchNorm2d reference(4);
  Tensor x_ref = input.clone().requires_grad_(true);
  Tensor y_ref = reference(x_ref);
  (y_ref * loss_weights).sum().backward();

  nn::SyncBatchNorm layer(4, default_group().communicator_ptr());
  layer->to(device);
  const auto mine = [&](const Tensor& t) { return t.slice(0, offsets[rank], offsets[rank + 1]); };
  Tensor x = mine(input).to(device).requires_grad_(true);
  Tensor y = layer(x);
  (y * mine(loss_weights).to(device)).sum().backward();
  Tensor grad_weight = reduce_value(layer->weight.grad().clone(), /*average=*/false);
  const double worst = std::max({max_diff(y.cpu(), mine(y_ref).detach()), max_diff(x.grad().cpu(), mine(x_ref.grad())),
                                 max_diff(grad_weight.cpu(), reference->weight.grad()),
                                 max_diff(layer->running_mean.cpu(), reference->running_mean),
                                 max_diff(layer->running_var.cpu(), reference->running_var)});
  std::cout << "[ largest difference ] on " << device << " over " << init.backend << ": " << worst << "\n";
  EXPECT_LT(worst, 1e-4);
  destroy_process_group();
}

TEST(SyncBatchNormOnGpu, EqualsBatchNormOnConcatenatedBatch) {
  TANDEM_SKIP_WITHOUT_GPU();
  const auto results = testing::run_worker_ranks(2, "SyncBatchNormOnGpuWorker.Run", std::chrono::seconds(120));
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_FALSE(results[r].timed_out) << "rank " << r << " hung:\n" << results[r].output;
    EXPECT_EQ(results[r].exit_code, 0) << "rank " << r << " output:\n" << results[r].output;
  }
}

TEST(SyncBatchNorm, WorldOfOneIsBatchNormExactly) {
  torch::manual_seed(3);
  const Tensor input = torch::randn({6, 3, 4, 4}) * 2 + 1, loss_weights = torch::randn({6, 3, 4, 4});
  torch::nn::BatchNorm2d reference(3);
  nn::SyncBatchNorm layer(3);  // no communicator and no process group: a world of one
  for (int step = 0; step < 2; ++step) {
    Tensor x_ref = input.clone().requires_grad_(true), x = input.clone().requires_grad_(true);
    Tensor y_ref = reference(x_ref), y = layer(x);
    (y_ref * loss_weights).sum().backward();
    (y * loss_weights).sum().backward();
    EXPECT_TRUE(torch::equal(y, y_ref));
    EXPECT_TRUE(torch::equal(x.grad(), x_ref.grad()));
  }
  EXPECT_TRUE(torch::equal(layer->weight.grad(), reference->weight.grad()));
  EXPECT_TRUE(torch::equal(layer->bias.grad(), reference->bias.grad()));
  EXPECT_TRUE(torch::equal(layer->running_mean, reference->running_mean));
  EXPECT_TRUE(torch::equal(layer->running_var, reference->running_var));
  EXPECT_TRUE(torch::equal(layer->num_batches_tracked, reference->num_batches_tracked));
  layer->eval();
  reference->eval();
  EXPECT_TRUE(torch::equal(layer(input), reference(input)));
}

TEST(SyncBatchNorm, EvalUsesRunningStatsAndCommunicatesNothing) {
  torch::manual_seed(4);
  nn::SyncBatchNorm layer(3, std::make_shared<NoCommunication>());
  torch::nn::BatchNorm2d reference(3);
  {
    torch::NoGradGuard no_grad;
    for (auto* module : std::vector<torch::nn::Module*>{layer.get(), reference.get()}) {
      module->named_buffers()["running_mean"].copy_(torch::tensor({1.0, -2.0, 0.5}));
      module->named_buffers()["running_var"].copy_(torch::tensor({4.0, 0.25, 1.0}));
    }
  }
  layer->eval();
  reference->eval();
  const Tensor input = torch::randn({2, 3, 5, 5});
  EXPECT_TRUE(torch::allclose(layer(input), reference(input)));
  // Training with a world of two must communicate; the failing communicator proves the eval path did not.
  layer->train();
  EXPECT_THROW(layer(input), CommError);
}

TEST(SyncBatchNorm, EvalWithoutRunningStatsNormalisesEachRankLocallyAndCommunicatesNothing) {
  torch::manual_seed(5);
  nn::SyncBatchNorm layer(torch::nn::BatchNormOptions(3).track_running_stats(false),
                          std::make_shared<NoCommunication>());
  layer->eval();
  const Tensor input = torch::randn({2, 3, 5, 5}) * 2 + 1;
  const Tensor local = torch::batch_norm(input, layer->weight, layer->bias, Tensor(), Tensor(), /*training=*/true,
                                         0.0, 1e-5, /*cudnn_enabled=*/false);
  EXPECT_TRUE(torch::allclose(layer(input), local));
}

// bfloat16 inputs whose channel mean (100.75) is not a bfloat16 value: statistics and gradient sums rounded to
// bfloat16 would shift the whole output; kept in float32 they leave only the output's own rounding.
TEST(SyncBatchNorm, ReducedPrecisionInputsKeepStatisticsInFloat32) {
  const int64_t per_rank = 64, channels = 2;
  const Tensor values = (100 + torch::arange(2 * per_rank * channels * 9, torch::kDouble).remainder(4) * 0.5)
                            .view({2 * per_rank, channels, 3, 3});
  const Tensor loss_weights = torch::randn({2 * per_rank, channels, 3, 3}, torch::kDouble);
  Tensor x_ref = values.clone().requires_grad_(true);
  const Tensor ref_out = torch::batch_norm(x_ref, Tensor(), Tensor(), Tensor(), Tensor(), true, 0.0, 1e-5, false);
  (ref_out * loss_weights).sum().backward();
  std::mutex mutex;
  double worst_out = 0, worst_grad = 0;
  testing::run_thread_ranks(2, [&](int rank, comm::Communicator& communicator) {
    nn::SyncBatchNorm layer(torch::nn::BatchNormOptions(channels).affine(false), borrow(communicator));
    Tensor x = values.slice(0, rank * per_rank, (rank + 1) * per_rank).to(torch::kBFloat16).requires_grad_(true);
    Tensor y = layer(x);
    EXPECT_EQ(y.scalar_type(), torch::kBFloat16);
    (y * loss_weights.slice(0, rank * per_rank, (rank + 1) * per_rank).to(torch::kBFloat16)).sum().backward();
    EXPECT_EQ(x.grad().scalar_type(), torch::kBFloat16);
    const double out = max_diff(y.to(torch::kDouble), ref_out.slice(0, rank * per_rank, (rank + 1) * per_rank));
    const double grad =
        max_diff(x.grad().to(torch::kDouble), x_ref.grad().slice(0, rank * per_rank, (rank + 1) * per_rank));
    std::lock_guard<std::mutex> lock(mutex);
    worst_out = std::max(worst_out, out);
    worst_grad = std::max(worst_grad, grad);
  });
  std::cout << "[ largest difference ] output " << worst_out << ", input grad " << worst_grad << "\n";
  // Outputs reach about 1.35 and input gradients about 10: bfloat16 rounds them by up to 2^-8 of that.
  EXPECT_LT(worst_out, 0.02);
  EXPECT_LT(worst_grad, 0.15);
}

TEST(SyncBatchNorm, RejectsWrongChannelCount) {
  nn::SyncBatchNorm layer(3);
  EXPECT_THROW(layer(torch::randn({2, 4, 3, 3})), InvalidArgument);
}

// A tree with BatchNorms at several depths, called through forward_batch_norm so conversion takes effect.
struct TinyNetImpl : torch::nn::Module {
  TinyNetImpl() {
    conv = register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(2, 3, 3).padding(1)));
    register_module("bn", torch::nn::BatchNorm2d(3));
    head = register_module("head", std::make_shared<torch::nn::Module>());
    head->register_module("norm", torch::nn::BatchNorm1d(3));
  }
  Tensor forward(const Tensor& x) {
    Tensor y = nn::forward_batch_norm(*named_children()["bn"], conv(x)).mean({2, 3});
    return nn::forward_batch_norm(*head->named_children()["norm"], y);
  }
  torch::nn::Conv2d conv{nullptr};
  std::shared_ptr<torch::nn::Module> head;
};
TORCH_MODULE(TinyNet);

TEST(ConvertSyncBatchNorm, KeepsNamesValuesAndTensors) {
  torch::manual_seed(5);
  TinyNet net;
  net->train();
  net(torch::randn({4, 2, 5, 5}));  // moves running stats off their initial values
  {
    torch::NoGradGuard no_grad;
    for (auto& p : net->parameters()) p.add_(torch::randn_like(p));
  }
  const auto params_before = net->named_parameters();
  const auto buffers_before = net->named_buffers();

  auto converted = nn::convert_sync_batchnorm(net.ptr(), std::make_shared<NoCommunication>());
  EXPECT_EQ(converted.get(), net.get());
  EXPECT_EQ(nn::count_sync_batchnorm(*net), 2);
  const auto params_after = net->named_parameters();
  const auto buffers_after = net->named_buffers();
  ASSERT_EQ(params_after.keys(), params_before.keys());
  ASSERT_EQ(buffers_after.keys(), buffers_before.keys());
  for (const auto& item : params_before) {
    EXPECT_TRUE(params_after[item.key()].is_same(item.value())) << item.key() << " is not the same tensor";
  }
  for (const auto& item : buffers_before) {
    EXPECT_TRUE(buffers_after[item.key()].is_same(item.value())) << item.key() << " is not the same tensor";
  }
  // forward() now runs the SyncBatchNorms, which communicate in training and not in eval.
  EXPECT_THROW(net(torch::randn({4, 2, 5, 5})), CommError);
  net->eval();
  EXPECT_NO_THROW(net(torch::randn({4, 2, 5, 5})));
}

TEST(ConvertSyncBatchNorm, RootBatchNormBecomesSyncBatchNorm) {
  torch::nn::BatchNorm1d bn(torch::nn::BatchNormOptions(5).momentum(0.3).eps(1e-3));
  auto converted = nn::convert_sync_batchnorm(bn.ptr());
  auto* sync = dynamic_cast<nn::SyncBatchNormImpl*>(converted.get());
  ASSERT_NE(sync, nullptr);
  EXPECT_DOUBLE_EQ(sync->options.momentum().value(), 0.3);
  EXPECT_DOUBLE_EQ(sync->options.eps(), 1e-3);
  EXPECT_TRUE(sync->weight.is_same(bn->weight));
  EXPECT_TRUE(sync->running_var.is_same(bn->running_var));
}

}  // namespace
}  // namespace tandem
