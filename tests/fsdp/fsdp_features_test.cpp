// What FSDP offers besides plain steps: no_sync accumulation and gradient clipping equal DDP's; units cut by
// each policy; memory per rank about 1/N plus the largest unit; a unit freed after forward or kept; refusals.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <mutex>
#include <set>
#include <thread>

#include "fsdp_fixtures.h"
#include "tandem/fsdp/unit_plan.h"
#include "tandem/optim/state_bytes.h"
#include "tandem/util/error.h"

namespace tandem::testing {
namespace {

TEST(FsdpFeatures, NoSyncAccumulationEqualsDdpNoSync) {
  FsdpScenario s;
  s.world = 2;
  s.micro_batches = 3;
  s.steps = 10;
  const NamedTensors expected = run_ddp(s);
  for (bool reshard : {true, false}) {
    s.options.reshard_after_forward = reshard;
    const double difference = relative_l2(run_fsdp(s), expected);
    std::printf("[fsdp no_sync] 3 micro-batches, reshard %d: relative L2 %.3g\n", reshard, difference);
    EXPECT_LE(difference, kFsdpRelativeTolerance);
  }
}

// BasicBlocks as units leave conv1, bn1 and fc to the root unit, which the forward uses first and last: it is
// gathered, freed and gathered again within one forward.
TEST(FsdpFeatures, BlocksAsUnitsAroundTheRootUnitEqualDdp) {
  FsdpScenario s;
  s.model = "resnet18";
  s.batch_per_rank = 2;
  s.steps = 5;
  s.options.units.module_types = {"BasicBlock"};
  const double difference = relative_l2(run_fsdp(s), run_ddp(s));
  std::printf("[fsdp units] ResNet-18, BasicBlocks as units, 5 steps: relative L2 %.3g\n", difference);
  EXPECT_LE(difference, kFsdpRelativeTolerance);
}

// An evaluation forward under NoGradGuard between steps (no backward follows it) gives DDP's outputs, and the
// training after it still equals DDP's.
TEST(FsdpFeatures, EvaluationBetweenStepsMatchesDdp) {
  FsdpScenario s;
  s.steps = 3;
  auto evaluate_between = [&](auto& model, int rank, torch::optim::Optimizer& optimizer) {
    train_steps(s, rank, model, optimizer, [] {});
    torch::Tensor outputs;
    {
      torch::NoGradGuard no_grad;
      model.eval();
      Batch batch = rank_batch(s, 99, 0, rank);
      model(batch.x);
      outputs = model(batch.x).clone();
      model.train();
    }
    train_steps(s, rank, model, optimizer, [] {});
    return outputs;
  };
  std::vector<torch::Tensor> ddp_outputs(2), fsdp_outputs(2);
  const NamedTensors ddp = on_thread_ranks(s, [&](int rank, comm::Communicator& communicator) {
    ddp::DistributedDataParallel<nn::CnnNet> model(make_cnn(7 + rank), borrow(communicator));
    auto optimizer = make_optimizer(s, model.parameters());
    ddp_outputs[rank] = evaluate_between(model, rank, *optimizer);
    NamedTensors result;
    for (const auto& entry : model.module()->named_parameters()) result.emplace_back(entry.key(), entry.value().detach().clone());
    return result;
  });
  const NamedTensors fsdp = on_thread_ranks(s, [&](int rank, comm::Communicator& communicator) {
    fsdp::FullyShardedDataParallel<nn::CnnNet> model(make_cnn(7 + rank), borrow(communicator));
    auto optimizer = make_optimizer(s, model.parameters());
    fsdp_outputs[rank] = evaluate_between(model, rank, *optimizer);
    return model.full_parameters();
  });
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_LE((fsdp_outputs[rank] - ddp_outputs[rank]).abs().max().item<double>(), 1e-5) << "rank " << rank;
  }
  EXPECT_LE(relative_l2(fsdp, ddp), kFsdpRelativeTolerance);
}

TEST(FsdpFeatures, ClippingTheShardsEqualsClippingTheFullGradient) {
  FsdpScenario s;
  s.world = 4;
  s.steps = 10;
  s.clip = 0.05;  // well below the gradient's norm, so that every step clips
  const double difference = relative_l2(run_fsdp(s), run_ddp(s));
  std::printf("[fsdp clipping] world 4, max norm 0.05: relative L2 %.3g\n", difference);
  EXPECT_LE(difference, kFsdpRelativeTolerance);
}

TEST(FsdpFeatures, ClipGradNormReturnsTheNormOfTheWholeGradient) {
  run_thread_ranks(2, [](int rank, comm::Communicator& communicator) {
    fsdp::FullyShardedDataParallel<nn::CnnNet> model(make_cnn(3), borrow(communicator));
    Batch batch = rank_batch(FsdpScenario{}, 0, 0, rank);
    torch::nn::functional::cross_entropy(model(batch.x), batch.y).backward();
    // The whole gradient, gathered shard by shard, against the norm clip_grad_norm reports.
    double squared = 0;
    for (const torch::Tensor& shard : model.parameters()) {
      torch::Tensor full = torch::empty({shard.numel() * 2});
      communicator.all_gather_into(full, shard.grad())->wait();
      squared += full.to(torch::kFloat64).pow(2).sum().item<double>();
    }
    const double norm = fsdp::clip_grad_norm(model.sharded(), 1e9);
    EXPECT_NEAR(norm, std::sqrt(squared), 1e-6 * std::sqrt(squared));
  });
}

TEST(FsdpFeatures, DefaultUnitsAreTheRootsChildrenAndPoliciesCutOthers) {
  nn::CnnNet cnn = make_cnn(1);
  std::vector<std::string> names;
  for (const auto& unit : fsdp::plan_units(*cnn, {})) names.push_back(unit.name);
  EXPECT_EQ(names, (std::vector<std::string>{"conv1", "conv2", "conv3", "fc1", "fc2", "output"}));

  nn::ResNet resnet = make_resnet18(1);
  const size_t parameter_count = resnet->parameters().size();
  auto check_cover = [&](const std::vector<fsdp::UnitSpec>& units) {
    std::set<const c10::TensorImpl*> seen;
    for (const auto& unit : units) {
      for (const auto& entry : unit.parameters) EXPECT_TRUE(seen.insert(entry.second.unsafeGetTensorImpl()).second);
    }
    EXPECT_EQ(seen.size(), parameter_count) << "every parameter in exactly one unit";
  };
  fsdp::UnitPolicy by_type;
  by_type.module_types = {"BasicBlock"};
  const auto blocks = fsdp::plan_units(*resnet, by_type);
  ASSERT_EQ(blocks.size(), 9u) << "eight BasicBlocks and the root unit (conv1, bn1, fc)";
  EXPECT_EQ(blocks.front().name, "layer1.0");
  EXPECT_EQ(blocks.back().name, "");
  EXPECT_EQ(blocks.back().parameters.front().first, "conv1.weight");
  check_cover(blocks);
  fsdp::UnitPolicy by_size;
  by_size.min_parameters = 1'000'000;
  const auto sized = fsdp::plan_units(*resnet, by_size);
  for (size_t i = 0; i + 1 < sized.size(); ++i) {
    int64_t count = 0;
    for (const auto& entry : sized[i].parameters) count += entry.second.numel();
    EXPECT_GE(count, 1'000'000) << sized[i].name;
  }
  check_cover(sized);
  fsdp::UnitPolicy both = by_size;
  both.module_types = {"BasicBlock"};
  try {
    fsdp::plan_units(*resnet, both);
    ADD_FAILURE() << "a policy with both fields was accepted";
  } catch (const InvalidArgument& error) {
    EXPECT_STREQ(error.what(), "fsdp unit policy sets both min_parameters and module_types; choose one");
  }
}

// A type that no module is (a typo, a ResNet block named for the CNN) would leave its modules to the root unit,
// and the model would train in fewer, larger units than asked, without a word: refused at construction, naming it
// and the types the model has.
TEST(FsdpFeatures, AModuleTypeThatNoModuleIsIsRefusedAtConstruction) {
  fsdp::FsdpOptions options;
  options.units.module_types = {"Conv2d", "BasicBlock"};
  try {
    fsdp::FullyShardedDataParallel<nn::CnnNet> model(make_cnn(1), nullptr, options);
    ADD_FAILURE() << "a policy naming a type the CNN lacks was accepted";
  } catch (const InvalidArgument& error) {
    EXPECT_STREQ(error.what(), "fsdp unit policy module_types names 'BasicBlock', which no module of the model is; "
                               "its modules are of the types Conv2d, MaxPool2d, Linear");
  }
}

// What the units hold right after forward, before backward: one unit (and the prefetch of the one backward
// needs next) when resharding, every unit when not.
TEST(FsdpFeatures, ForwardFreesUnitsOnlyWhenResharding) {
  run_thread_ranks(2, [](int rank, comm::Communicator& communicator) {
    for (bool reshard : {true, false}) {
      fsdp::FsdpOptions options;
      options.reshard_after_forward = reshard;
      fsdp::FullyShardedDataParallel<nn::CnnNet> model(make_cnn(5), borrow(communicator), options);
      int64_t largest = 0, all = 0;
      for (const auto& unit : model.sharded().units()) {
        largest = std::max(largest, unit->unsharded_bytes());
        all += unit->unsharded_bytes();
      }
      Batch batch = rank_batch(FsdpScenario{}, 0, 0, rank);
      torch::Tensor loss = torch::nn::functional::cross_entropy(model(batch.x), batch.y);
      const int64_t after_forward = model.sharded().held_bytes().unsharded;
      if (reshard) {
        EXPECT_LE(after_forward, 2 * largest);
        EXPECT_LE(model.sharded().peak_unsharded_bytes(), 2 * largest);
      } else {
        EXPECT_EQ(after_forward, all);
      }
      loss.backward();
      EXPECT_EQ(model.sharded().held_bytes().unsharded, 0) << "backward frees every unit";
      EXPECT_EQ(model.sharded().held_bytes().full_gradients, 0) << "and reduces every gradient";
    }
  });
}

// Parameters, gradients and optimizer state per rank after a step, counted as ZeRO's are: about 1/N of one
// rank's, plus padding; the gathered parameters peak at two units (the one running and the one prefetched).
TEST(FsdpFeatures, MemoryPerRankIsAboutOneNthPlusTheLargestUnit) {
  std::map<int, int64_t> held;
  int64_t largest = 0;
  for (int world : {1, 2, 4}) {
    std::mutex mutex;
    run_thread_ranks(world, [&](int rank, comm::Communicator& communicator) {
      fsdp::FullyShardedDataParallel<nn::CnnNet> model(make_cnn(9), borrow(communicator));
      torch::optim::AdamW optimizer(model.parameters(), torch::optim::AdamWOptions(1e-3));
      FsdpScenario s;
      s.world = world;
      for (int step = 0; step < 2; ++step) {
        optimizer.zero_grad();
        Batch batch = rank_batch(s, step, 0, rank);
        torch::nn::functional::cross_entropy(model(batch.x), batch.y).backward();
        optimizer.step();
      }
      const fsdp::HeldBytes bytes = model.sharded().held_bytes();
      const int64_t state = optim::optimizer_state_bytes(optimizer);
      int64_t unit_bytes = 0;
      for (const auto& unit : model.sharded().units()) unit_bytes = std::max(unit_bytes, unit->unsharded_bytes());
      std::lock_guard<std::mutex> lock(mutex);
      held[world] = std::max(held[world], bytes.total() + state);
      largest = unit_bytes;
      if (rank == 0) {
        std::printf("[fsdp memory] world %d rank 0: shards %lld, shard grads %lld, optimizer state %lld, "
                    "unsharded %lld, total %lld bytes; peak gathered %lld (largest unit %lld)\n",
                    world, static_cast<long long>(bytes.shards), static_cast<long long>(bytes.shard_gradients),
                    static_cast<long long>(state), static_cast<long long>(bytes.unsharded),
                    static_cast<long long>(bytes.total() + state),
                    static_cast<long long>(model.sharded().peak_unsharded_bytes()), static_cast<long long>(unit_bytes));
      }
      EXPECT_LE(model.sharded().peak_unsharded_bytes(), 2 * unit_bytes);
    });
  }
  for (int world : {2, 4}) {
    EXPECT_GE(held[world], held[1] / world) << world;
    EXPECT_LE(held[world], held[1] / world + largest) << world;
  }
}

// Two backward passes through one forward's graph (retain_graph) each reduce their gradients into the shards:
// twice the gradient of one, as for the module's own parameters.
TEST(FsdpFeatures, ASecondBackwardThroughTheSameGraphAddsItsGradients) {
  run_thread_ranks(2, [](int rank, comm::Communicator& communicator) {
    fsdp::FullyShardedDataParallel<nn::CnnNet> model(make_cnn(4), borrow(communicator));
    Batch batch = rank_batch(FsdpScenario{}, 0, 0, rank);
    torch::Tensor loss = torch::nn::functional::cross_entropy(model(batch.x), batch.y);
    loss.backward({}, /*retain_graph=*/true);
    std::vector<torch::Tensor> once;
    for (const torch::Tensor& shard : model.parameters()) once.push_back(shard.grad().clone());
    loss.backward();
    const auto shards = model.parameters();
    for (size_t i = 0; i < shards.size(); ++i) {
      EXPECT_TRUE(torch::allclose(shards[i].grad(), 2 * once[i], 1e-6, 1e-8)) << "unit " << i;
    }
    EXPECT_EQ(model.sharded().held_bytes().unsharded, 0);
  });
}

// A gather fails inside the operator observer, where LibTorch would swallow an exception: the forward must still
// end in the collective's error rather than compute on placeholders and return.
TEST(FsdpFeatures, AGatherThatFailsEndsTheForwardInItsError) {
  std::atomic<bool> rank0_done{false};
  run_thread_ranks(
      2,
      [&](int rank, comm::Communicator& communicator) {
        fsdp::FullyShardedDataParallel<nn::CnnNet> model(make_cnn(1), borrow(communicator));
        if (rank == 1) {
          // Never joins the forward's gathers; stays until rank 0 has seen its error, so the error is a timeout.
          while (!rank0_done) std::this_thread::yield();
          return;
        }
        Batch batch = rank_batch(FsdpScenario{}, 0, 0, rank);
        try {
          model(batch.x);
          ADD_FAILURE() << "the forward returned although its gathers failed";
        } catch (const CommError& error) {
          EXPECT_NE(std::string(error.what()).find("all_gather_into"), std::string::npos) << error.what();
        }
        rank0_done = true;
      },
      std::chrono::seconds(2));
}

TEST(FsdpFeatures, RefusesParametersItCannotShard) {
  auto refusal = [](torch::nn::Linear layer) -> std::string {
    try {
      torch::nn::Sequential model(layer);
      fsdp::ShardedModel sharded(*model, nullptr, {});
    } catch (const Error& error) {
      return error.what();
    }
    return "(accepted)";
  };
  torch::nn::Linear doubles(2, 2);
  doubles->to(torch::kFloat64);
  EXPECT_EQ(refusal(doubles),
            "fsdp shards float32 parameters only, but 0.weight is Double; keep the model in float32 and compute in a "
            "lower precision through FsdpOptions::mixed_precision");
  torch::nn::Linear frozen(2, 2);
  frozen->bias.requires_grad_(false);
  EXPECT_EQ(refusal(frozen),
            "fsdp shards trainable parameters only, but 0.bias does not require grad; unfreeze it or keep it out of "
            "the model that fsdp wraps");
}

}  // namespace
}  // namespace tandem::testing
