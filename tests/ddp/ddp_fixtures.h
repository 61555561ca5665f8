#pragma once
// A small model and the two ways of training it that DDP must make equal: one process on the whole batch,
// and N ranks with DistributedDataParallel on one slice each.
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "tandem/ddp/distributed_data_parallel.h"

namespace tandem::testing {

struct NetImpl : torch::nn::Module {
  NetImpl(int64_t hidden, bool with_extra) {
    fc1 = register_module("fc1", torch::nn::Linear(8, hidden));
    fc2 = register_module("fc2", torch::nn::Linear(hidden, 16));
    fc3 = register_module("fc3", torch::nn::Linear(16, 4));
    if (with_extra) extra = register_module("extra", torch::nn::Linear(16, 4));
  }
  torch::Tensor forward(torch::Tensor x) {
    torch::Tensor h = torch::tanh(fc2(torch::tanh(fc1(x))));
    torch::Tensor out = fc3(h);
    if (use_extra) out = out + extra(h);
    return out;
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr}, extra{nullptr};
  bool use_extra = false;
};
TORCH_MODULE(Net);

struct Scenario {
  int world = 2;
  int batch_per_rank = 4;
  int micro_batches = 1;  // >1: all but the last under no_sync
  int steps = 20;
  bool frozen_fc1 = false;
  bool with_extra = false;  // an `extra` layer that forward never uses
  torch::Device device = torch::kCPU;  // where the model and the batches live (values are drawn on the CPU)
  ddp::DdpOptions options;
};

inline torch::Generator generator(uint64_t seed) { return at::make_generator<at::CPUGeneratorImpl>(seed); }

// Deterministic initial values that differ per `seed` (ranks start different; DDP must broadcast rank 0's).
inline Net make_net(const Scenario& s, uint64_t seed, int64_t hidden = 16) {
  Net net(hidden, s.with_extra);
  torch::NoGradGuard no_grad;
  auto gen = generator(seed);
  for (auto& p : net->parameters()) p.copy_(torch::randn(p.sizes(), gen) * 0.3);
  net->to(s.device);
  if (s.frozen_fc1) {
    net->fc1->weight.requires_grad_(false);
    net->fc1->bias.requires_grad_(false);
  }
  return net;
}

struct Batch {
  torch::Tensor x, y;
};
// The whole batch of one step: world * micro_batches * batch_per_rank rows.
inline Batch full_batch(const Scenario& s, int step) {
  auto gen = generator(1000 + step);
  const int64_t rows = int64_t{s.world} * s.micro_batches * s.batch_per_rank;
  return {torch::randn({rows, 8}, gen).to(s.device), torch::randn({rows, 4}, gen).to(s.device)};
}

inline torch::optim::SGD make_sgd(const std::vector<torch::Tensor>& params) {
  return torch::optim::SGD(params, torch::optim::SGDOptions(0.05).momentum(0.9).weight_decay(1e-2));
}

inline std::vector<torch::Tensor> snapshot(torch::nn::Module& module) {
  std::vector<torch::Tensor> values;
  for (auto& p : module.parameters()) values.push_back(p.detach().cpu().clone());
  return values;
}

// One process, no DDP, the concatenated batch, mean loss.
inline std::vector<torch::Tensor> train_reference(const Scenario& s) {
  Net net = make_net(s, /*seed=*/7);
  auto optimizer = make_sgd(net->parameters());
  for (int step = 0; step < s.steps; ++step) {
    Batch batch = full_batch(s, step);
    optimizer.zero_grad();
    torch::mse_loss(net->forward(batch.x), batch.y).backward();
    optimizer.step();
  }
  return snapshot(*net);
}

// Rank `rank` of s.world with DDP: micro-batch k of step takes rows [((k*world)+rank)*b, +b); each micro loss is
// scaled by 1/micro_batches so the accumulated sum matches the whole batch's mean.
inline std::vector<torch::Tensor> train_ddp(const Scenario& s, int rank, comm::CommunicatorPtr communicator) {
  Net net = make_net(s, /*seed=*/7 + rank);
  ddp::DistributedDataParallel<Net> model(net, communicator, s.options);
  auto optimizer = make_sgd(model.parameters());
  for (int step = 0; step < s.steps; ++step) {
    Batch batch = full_batch(s, step);
    optimizer.zero_grad();
    for (int k = 0; k < s.micro_batches; ++k) {
      const int64_t begin = (int64_t{k} * s.world + rank) * s.batch_per_rank;
      auto x = batch.x.narrow(0, begin, s.batch_per_rank), y = batch.y.narrow(0, begin, s.batch_per_rank);
      auto step_micro = [&] { (torch::mse_loss(model(x), y) / s.micro_batches).backward(); };
      if (k + 1 < s.micro_batches) {
        auto guard = model.no_sync();
        step_micro();
      } else {
        step_micro();
      }
    }
    optimizer.step();
  }
  return snapshot(*model.module());
}

struct Difference {
  double max_abs = 0, max_rel = 0;
};

// Largest |a-b| and largest relative difference, each tensor's max|a-b| / max|b| (relative to the tensor's
// scale, so entries that happen to be near zero do not turn float32 rounding into a large ratio).
inline Difference compare(const std::vector<torch::Tensor>& got, const std::vector<torch::Tensor>& expected) {
  Difference d;
  EXPECT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < std::min(got.size(), expected.size()); ++i) {
    const double diff = (got[i] - expected[i]).abs().max().item<double>();
    d.max_abs = std::max(d.max_abs, diff);
    d.max_rel = std::max(d.max_rel, diff / std::max(expected[i].abs().max().item<double>(), 1e-12));
  }
  return d;
}

// One rank of a real multi-process job: joins the default group over `backend` on `device` ("cpu" or
// "cuda"), trains with no_sync micro-batches and several buckets, and expects the parameters of one process
// trained on the whole batch (on the same device).
inline void check_ddp_process_rank(const std::string& backend, const std::string& device = "cpu") {
  InitOptions init;
  init.backend = backend;
  init.device = device;
  init.timeout = std::chrono::seconds(30);
  init_process_group(init);
  Scenario s;
  s.device = default_group().device();
  s.world = world_size();
  s.micro_batches = 2;
  s.options.bucket_cap_mb = 300.0 / (1024 * 1024);
  s.options.first_bucket_cap_mb = 100.0 / (1024 * 1024);
  const Difference d = compare(train_ddp(s, rank(), default_group().communicator_ptr()), train_reference(s));
  std::printf("[process parity] %s on %s rank %d: largest difference abs %.3g relative %.3g\n", backend.c_str(),
              s.device.str().c_str(), rank(), d.max_abs, d.max_rel);
  // GPU kernels sum a batch of b rows in another order than one of N*b: float32 rounding, over 20 steps.
  EXPECT_LE(d.max_rel, s.device.is_cuda() ? 1e-4 : 1e-5);
  destroy_process_group();
}

// A non-owning pointer for communicators that live on a test thread's stack.
inline comm::CommunicatorPtr borrow(comm::Communicator& communicator) {
  return comm::CommunicatorPtr(&communicator, [](comm::Communicator*) {});
}

}  // namespace tandem::testing
