#pragma once
// Training the same model from the same start on the same batches, once with DDP and once with FSDP, on ranks
// as threads: what FSDP's parity and memory tests compare.
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "support/thread_ranks.h"
#include "tandem/ddp/distributed_data_parallel.h"
#include "tandem/fsdp/fully_sharded_data_parallel.h"
#include "tandem/fsdp/gradient_clipping.h"
#include "tandem/nn/cnn_net.h"
#include "tandem/nn/resnet.h"

namespace tandem::testing {

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

// The bar for FSDP against DDP: relative L2 of all parameters.
inline constexpr double kFsdpRelativeTolerance = 1e-5;

struct FsdpScenario {
  std::string model = "cnn";      // "cnn" (the seeds' CnnNet, 28x28) or "resnet18" (BatchNorm, 32x32 images)
  std::string optimizer = "sgd";  // "sgd" (momentum, weight decay) or "adamw"
  int world = 2;
  int batch_per_rank = 4;
  int micro_batches = 1;  // >1: all but the last under no_sync
  int steps = 30;
  double clip = 0;        // >0: clip the gradient's global norm to this before each step
  double learning_rate = 0;  // 0: SGD's 0.02, AdamW's 1e-3
  fsdp::FsdpOptions options;
};

inline comm::CommunicatorPtr borrow(comm::Communicator& communicator) {
  return comm::CommunicatorPtr(&communicator, [](comm::Communicator*) {});
}

inline torch::Generator generator(uint64_t seed) { return at::make_generator<at::CPUGeneratorImpl>(seed); }

// Models are built under LibTorch's global generator, which the rank threads share: one at a time, seeded.
template <typename Build>
auto seeded(uint64_t seed, Build build) {
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  torch::manual_seed(seed);
  return build();
}

inline nn::CnnNet make_cnn(uint64_t seed) {
  return seeded(seed, [] { return nn::CnnNet(); });
}

inline nn::ResNet make_resnet18(uint64_t seed) {
  return seeded(seed, [] {
    nn::ResNetOptions options;
    options.num_classes = 10;
    return nn::ResNet(options);
  });
}

struct Batch {
  torch::Tensor x, y;
};

// Micro-batch k of `step` for `rank`: rows ((k * world) + rank) * b of the step's whole batch.
inline Batch rank_batch(const FsdpScenario& s, int step, int micro, int rank) {
  auto gen = generator(1000 + step);
  const int64_t rows = int64_t{s.world} * s.micro_batches * s.batch_per_rank;
  const bool cnn = s.model == "cnn";
  torch::Tensor x = cnn ? torch::randn({rows, 1, 28, 28}, gen) : torch::randn({rows, 3, 32, 32}, gen);
  torch::Tensor y = torch::randint(10, {rows}, gen);
  const int64_t begin = (int64_t{micro} * s.world + rank) * s.batch_per_rank;
  return {x.narrow(0, begin, s.batch_per_rank), y.narrow(0, begin, s.batch_per_rank)};
}

inline std::unique_ptr<torch::optim::Optimizer> make_optimizer(const FsdpScenario& s,
                                                               const std::vector<torch::Tensor>& params) {
  if (s.optimizer == "sgd") {
    return std::make_unique<torch::optim::SGD>(
        params, torch::optim::SGDOptions(s.learning_rate > 0 ? s.learning_rate : 0.02).momentum(0.9).weight_decay(1e-4));
  }
  return std::make_unique<torch::optim::AdamW>(
      params, torch::optim::AdamWOptions(s.learning_rate > 0 ? s.learning_rate : 1e-3).weight_decay(1e-2));
}

// The loop both wrappers run: micro-batches (all but the last under no_sync), clipping, a step.
template <typename Wrapper>
void train_steps(const FsdpScenario& s, int rank, Wrapper& model, torch::optim::Optimizer& optimizer,
                 const std::function<void()>& clip) {
  for (int step = 0; step < s.steps; ++step) {
    optimizer.zero_grad();
    for (int k = 0; k < s.micro_batches; ++k) {
      Batch batch = rank_batch(s, step, k, rank);
      auto micro_step = [&] {
        (torch::nn::functional::cross_entropy(model(batch.x), batch.y) / s.micro_batches).backward();
      };
      if (k + 1 < s.micro_batches) {
        [[maybe_unused]] auto guard = model.no_sync();
        micro_step();
      } else {
        micro_step();
      }
    }
    if (s.clip > 0) clip();
    optimizer.step();
  }
}

template <typename Holder>
NamedTensors train_ddp(const FsdpScenario& s, int rank, comm::Communicator& communicator, Holder net) {
  ddp::DistributedDataParallel<Holder> model(net, borrow(communicator));
  auto optimizer = make_optimizer(s, model.parameters());
  train_steps(s, rank, model, *optimizer,
              [&] { torch::nn::utils::clip_grad_norm_(model.parameters(), s.clip); });
  NamedTensors result;
  for (const auto& entry : model.module()->named_parameters()) result.emplace_back(entry.key(), entry.value().detach().clone());
  return result;
}

template <typename Holder>
NamedTensors train_fsdp(const FsdpScenario& s, int rank, comm::Communicator& communicator, Holder net) {
  fsdp::FullyShardedDataParallel<Holder> model(net, borrow(communicator), s.options);
  auto optimizer = make_optimizer(s, model.parameters());
  train_steps(s, rank, model, *optimizer, [&] { fsdp::clip_grad_norm(model.sharded(), s.clip); });
  return model.full_parameters();
}

// Runs `train` on s.world thread ranks (each starting from its own seed, so that the broadcast of rank 0's
// start matters) and returns rank 0's result.
inline NamedTensors on_thread_ranks(
    const FsdpScenario& s, const std::function<NamedTensors(int, comm::Communicator&)>& train) {
  NamedTensors result;
  run_thread_ranks(
      s.world,
      [&](int rank, comm::Communicator& communicator) {
        torch::set_num_threads(1);
        NamedTensors mine = train(rank, communicator);
        if (rank == 0) result = std::move(mine);
      },
      std::chrono::seconds(120));
  return result;
}

inline NamedTensors run_ddp(const FsdpScenario& s) {
  return on_thread_ranks(s, [&](int rank, comm::Communicator& communicator) {
    return s.model == "cnn" ? train_ddp(s, rank, communicator, make_cnn(7 + rank))
                            : train_ddp(s, rank, communicator, make_resnet18(7 + rank));
  });
}

inline NamedTensors run_fsdp(const FsdpScenario& s) {
  return on_thread_ranks(s, [&](int rank, comm::Communicator& communicator) {
    return s.model == "cnn" ? train_fsdp(s, rank, communicator, make_cnn(7 + rank))
                            : train_fsdp(s, rank, communicator, make_resnet18(7 + rank));
  });
}

// Rank 0's start, which both wrappers broadcast.
inline NamedTensors initial_parameters(const FsdpScenario& s) {
  NamedTensors result;
  auto copy = [&](torch::nn::Module& module) {
    for (const auto& entry : module.named_parameters()) result.emplace_back(entry.key(), entry.value().detach().clone());
  };
  if (s.model == "cnn") {
    copy(*make_cnn(7));
  } else {
    copy(*make_resnet18(7));
  }
  return result;
}

// ||got - expected|| / ||expected|| over all parameters together, matched by name.
inline double relative_l2(const NamedTensors& got, const NamedTensors& expected) {
  EXPECT_EQ(got.size(), expected.size());
  std::map<std::string, torch::Tensor> by_name(got.begin(), got.end());
  double difference = 0, reference = 0;
  for (const auto& [name, value] : expected) {
    auto found = by_name.find(name);
    if (found == by_name.end()) {
      ADD_FAILURE() << "FSDP has no parameter " << name;
      return INFINITY;
    }
    difference += (found->second.to(torch::kFloat64) - value.to(torch::kFloat64)).pow(2).sum().item<double>();
    reference += value.to(torch::kFloat64).pow(2).sum().item<double>();
  }
  return std::sqrt(difference / reference);
}

}  // namespace tandem::testing
