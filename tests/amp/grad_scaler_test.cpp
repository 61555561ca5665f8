// GradScaler against PyTorch's torch.amp.GradScaler (a fixture PyTorch made), its call-order rules, its state,
// and its decisions across ranks: alone, under DDP with no_sync accumulation, and with the fp16 comm hook.
#include "tandem/amp/grad_scaler.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "ddp/ddp_fixtures.h"
#include "support/json_fixture.h"
#include "support/thread_ranks.h"
#include "tandem/ddp/comm_hook.h"
#include "tandem/util/error.h"

namespace tandem::amp {
namespace {

using testing::borrow;

float decode(const nlohmann::json& value) {
  if (value.is_string()) {
    const std::string text = value.get<std::string>();
    if (text == "nan") return std::numeric_limits<float>::quiet_NaN();
    return text == "inf" ? std::numeric_limits<float>::infinity() : -std::numeric_limits<float>::infinity();
  }
  return value.get<float>();
}

torch::Tensor vector_of(const nlohmann::json& values) {
  std::vector<float> floats;
  for (const auto& value : values) floats.push_back(decode(value));
  return torch::tensor(floats);
}

GradScalerOptions options_of(const nlohmann::json& options) {
  GradScalerOptions o;
  o.init_scale = options.at("init_scale").get<double>();
  o.growth_factor = options.at("growth_factor").get<double>();
  o.backoff_factor = options.at("backoff_factor").get<double>();
  o.growth_interval = options.at("growth_interval").get<int64_t>();
  return o;
}

// One step of the fixture's training: the loss's gradient with respect to `param` is `grad`.
bool scripted_step(GradScaler& scaler, torch::optim::Optimizer& optimizer, const torch::Tensor& param,
                   const torch::Tensor& grad) {
  optimizer.zero_grad();
  scaler.scale((param * grad).sum()).backward();
  const bool stepped = scaler.step(optimizer);
  scaler.update();
  return stepped;
}

TEST(GradScaler, DecidesLikePyTorchStepForStep) {
  const nlohmann::json fixture = testing::load_json_fixture("grad_scaler_pytorch.json");
  ASSERT_EQ(fixture.at("configs").size(), 4u);
  for (const auto& config : fixture.at("configs")) {
    SCOPED_TRACE(config.at("name").get<std::string>());
    ASSERT_GE(config.at("steps").size(), 30u);
    torch::Tensor param = torch::zeros({3}, torch::requires_grad());
    torch::optim::SGD optimizer({param}, torch::optim::SGDOptions(1.0));
    GradScaler scaler(options_of(config.at("options")));
    int index = 0, skipped = 0;
    for (const auto& step : config.at("steps")) {
      SCOPED_TRACE("step " + std::to_string(index++));
      EXPECT_EQ(scaler.get_scale(), step.at("scale_before").get<double>());
      const bool stepped = scripted_step(scaler, optimizer, param, vector_of(step.at("grad")));
      skipped += stepped ? 0 : 1;
      EXPECT_EQ(stepped, step.at("stepped").get<bool>());
      EXPECT_EQ(scaler.get_scale(), step.at("scale_after").get<double>());
      EXPECT_EQ(scaler.state_dict().growth_tracker, step.at("growth_tracker").get<int64_t>());
      EXPECT_TRUE(torch::equal(param.detach(), vector_of(step.at("param_after"))))
          << param << " vs " << step.at("param_after");
    }
    EXPECT_GT(skipped, 0);
  }
}

TEST(GradScaler, UnscaleLeavesTheTrueGradientsForClipping) {
  torch::manual_seed(0);
  torch::nn::Linear model(4, 3);
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1));
  const torch::Tensor x = torch::randn({5, 4});
  torch::mse_loss(model(x), torch::zeros({5, 3})).backward();
  std::vector<torch::Tensor> expected;
  for (const auto& p : model->parameters()) expected.push_back(p.grad().clone());

  optimizer.zero_grad();
  GradScaler scaler;
  const torch::Tensor scaled = scaler.scale(torch::mse_loss(model(x), torch::zeros({5, 3})));
  EXPECT_EQ(scaled.scalar_type(), torch::kFloat32);
  scaled.backward();
  EXPECT_FALSE(torch::equal(model->weight.grad(), expected[0]));
  scaler.unscale_(optimizer);
  // A power-of-two scale divides out exactly.
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_TRUE(torch::equal(model->parameters()[i].grad(), expected[i]));
  torch::nn::utils::clip_grad_norm_(model->parameters(), 0.01);
  const torch::Tensor clipped = model->weight.grad().clone();
  EXPECT_TRUE(scaler.step(optimizer));  // no second unscale: the clipped gradients are what it steps on
  EXPECT_TRUE(torch::equal(model->weight.grad(), clipped));
  scaler.update();
}

TEST(GradScaler, CallsOutOfOrderAreRefused) {
  torch::Tensor param = torch::zeros({2}, torch::requires_grad());
  torch::optim::SGD optimizer({param}, torch::optim::SGDOptions(1.0));
  GradScaler scaler;
  EXPECT_THROW(scaler.update(), InvalidArgument);
  scaler.scale(param.sum()).backward();
  scaler.unscale_(optimizer);
  EXPECT_THROW(scaler.unscale_(optimizer), InvalidArgument);
  EXPECT_TRUE(scaler.step(optimizer));
  EXPECT_THROW(scaler.step(optimizer), InvalidArgument);
  EXPECT_THROW(scaler.unscale_(optimizer), InvalidArgument);
  scaler.update();
  EXPECT_THROW(scaler.update(), InvalidArgument);
}

TEST(GradScaler, ADisabledScalerIsPlainTraining) {
  torch::Tensor param = torch::ones({2}, torch::requires_grad());
  torch::optim::SGD optimizer({param}, torch::optim::SGDOptions(1.0));
  GradScalerOptions options;
  options.enabled = false;
  GradScaler scaler(options);
  const torch::Tensor loss = (param * 3).sum();
  EXPECT_TRUE(scaler.scale(loss).is_same(loss));
  loss.backward();
  EXPECT_TRUE(scaler.step(optimizer));
  scaler.update();
  EXPECT_TRUE(torch::equal(param.detach(), torch::full({2}, -2.0f)));
  EXPECT_EQ(scaler.get_scale(), 1.0);
}

TEST(GradScaler, ALoadedStateContinuesAsTheOriginalWould) {
  GradScalerOptions options;
  options.growth_interval = 3;
  options.init_scale = 1024;
  GradScaler original(options), restored;
  torch::Tensor a = torch::zeros({1}, torch::requires_grad()), b = torch::zeros({1}, torch::requires_grad());
  torch::optim::SGD optimizer_a({a}, torch::optim::SGDOptions(1.0)), optimizer_b({b}, torch::optim::SGDOptions(1.0));
  const auto grad_at = [](int step) {
    return torch::full({1}, step % 7 == 6 ? std::numeric_limits<float>::infinity() : 0.5f);
  };
  for (int step = 0; step < 8; ++step) scripted_step(original, optimizer_a, a, grad_at(step));
  restored.load_state_dict(original.state_dict());
  EXPECT_EQ(restored.state_dict().growth_interval, 3);
  for (int step = 8; step < 24; ++step) {
    EXPECT_EQ(scripted_step(original, optimizer_a, a, grad_at(step)), scripted_step(restored, optimizer_b, b, grad_at(step)));
    EXPECT_EQ(original.get_scale(), restored.get_scale()) << "step " << step;
    EXPECT_EQ(original.state_dict().growth_tracker, restored.state_dict().growth_tracker);
  }
}

TEST(GradScaler, RefusesFloat16GradientsAndBadOptions) {
  torch::Tensor param = torch::zeros({2}, torch::TensorOptions().dtype(torch::kHalf).requires_grad(true));
  param.mutable_grad() = torch::ones({2}, torch::kHalf);
  torch::optim::SGD optimizer({param}, torch::optim::SGDOptions(1.0));
  GradScaler scaler;
  EXPECT_THROW(scaler.unscale_(optimizer), InvalidArgument);
  GradScalerOptions bad;
  bad.growth_factor = 1;
  EXPECT_THROW(GradScaler{bad}, InvalidArgument);
  bad = {};
  bad.backoff_factor = 1;
  EXPECT_THROW(GradScaler{bad}, InvalidArgument);
  bad = {};
  bad.growth_interval = 0;
  EXPECT_THROW(GradScaler{bad}, InvalidArgument);
  bad = {};
  bad.init_scale = 1e39;  // beyond float32
  EXPECT_THROW(GradScaler{bad}, InvalidArgument);
}

// Without DDP each rank's gradients are its own: rank 1's inf must still skip rank 0's step.
TEST(GradScalerRanks, AnInfOnOneRankSkipsTheStepOnEveryRank) {
  testing::run_thread_ranks(2, [](int rank, comm::Communicator& communicator) {
    torch::Tensor agreed = torch::zeros({2}, torch::requires_grad()), alone = torch::zeros({2}, torch::requires_grad());
    torch::optim::SGD optimizer_agreed({agreed}, torch::optim::SGDOptions(1.0));
    torch::optim::SGD optimizer_alone({alone}, torch::optim::SGDOptions(1.0));
    GradScaler with_ranks({}, borrow(communicator)), without_ranks;
    const torch::Tensor grad = rank == 1 ? torch::tensor({1.0f, std::numeric_limits<float>::infinity()})
                                         : torch::tensor({1.0f, 2.0f});
    EXPECT_FALSE(scripted_step(with_ranks, optimizer_agreed, agreed, grad));
    EXPECT_EQ(with_ranks.get_scale(), 32768.0);
    EXPECT_TRUE(torch::equal(agreed.detach(), torch::zeros({2})));
    // The check the communicator adds: alone, rank 0 would have stepped while rank 1 did not.
    EXPECT_EQ(scripted_step(without_ranks, optimizer_alone, alone, grad), rank == 0);
  });
}

// A power-of-two scale commutes with every rounding on the way (products, sums, DDP's average), so scaled
// training with no_sync accumulation is bit-identical to unscaled DDP.
TEST(GradScalerRanks, NoSyncAccumulationUnderScalingIsBitIdenticalToPlainDdp) {
  testing::Scenario s;
  s.micro_batches = 2;
  s.steps = 8;
  testing::run_thread_ranks(2, [&](int rank, comm::Communicator& communicator) {
    const std::vector<torch::Tensor> plain = testing::train_ddp(s, rank, borrow(communicator));
    testing::Net net = testing::make_net(s, /*seed=*/7 + rank);
    ddp::DistributedDataParallel<testing::Net> model(net, borrow(communicator), s.options);
    auto optimizer = testing::make_sgd(model.parameters());
    GradScaler scaler({}, borrow(communicator));
    for (int step = 0; step < s.steps; ++step) {
      testing::Batch batch = testing::full_batch(s, step);
      optimizer.zero_grad();
      for (int k = 0; k < s.micro_batches; ++k) {
        const int64_t begin = (int64_t{k} * s.world + rank) * s.batch_per_rank;
        auto x = batch.x.narrow(0, begin, s.batch_per_rank), y = batch.y.narrow(0, begin, s.batch_per_rank);
        auto micro_step = [&] { scaler.scale(torch::mse_loss(model(x), y) / s.micro_batches).backward(); };
        if (k + 1 < s.micro_batches) {
          auto guard = model.no_sync();
          micro_step();
        } else {
          micro_step();
        }
      }
      EXPECT_TRUE(scaler.step(optimizer));
      scaler.update();
    }
    const testing::Difference d = testing::compare(testing::snapshot(*model.module()), plain);
    std::printf("[scaled no_sync] rank %d: largest difference from unscaled DDP %.3g\n", rank, d.max_abs);
    EXPECT_EQ(d.max_abs, 0.0);
  });
}

// The fp16 hook sends gradients as float16: scaled by 2^40 they overflow it. Every rank skips, the scale backs
// off until they fit, and then every rank trains, the ranks equal throughout.
TEST(GradScalerRanks, Fp16HookOverflowBacksOffOnEveryRankUntilTheGradientsFit) {
  testing::Scenario s;
  s.options.comm_hook = ddp::make_fp16_compress_hook();
  std::vector<std::vector<double>> scales(2);
  std::vector<std::vector<torch::Tensor>> finals(2);
  testing::run_thread_ranks(2, [&](int rank, comm::Communicator& communicator) {
    testing::Net net = testing::make_net(s, /*seed=*/7 + rank);
    ddp::DistributedDataParallel<testing::Net> model(net, borrow(communicator), s.options);
    auto optimizer = testing::make_sgd(model.parameters());
    GradScalerOptions options;
    options.init_scale = std::pow(2.0, 40);
    GradScaler scaler(options, borrow(communicator));
    int stepped = 0;
    for (int step = 0; step < 40; ++step) {
      testing::Batch batch = testing::full_batch(s, step);
      auto x = batch.x.narrow(0, rank * s.batch_per_rank, s.batch_per_rank);
      auto y = batch.y.narrow(0, rank * s.batch_per_rank, s.batch_per_rank);
      optimizer.zero_grad();
      scaler.scale(torch::mse_loss(model(x), y)).backward();
      stepped += scaler.step(optimizer) ? 1 : 0;
      scaler.update();
      scales[rank].push_back(scaler.get_scale());
    }
    EXPECT_GT(stepped, 10);
    finals[rank] = testing::snapshot(*model.module());
  });
  EXPECT_EQ(scales[0], scales[1]);
  EXPECT_LT(scales[0].back(), std::pow(2.0, 40));
  EXPECT_EQ(scales[0].front(), std::pow(2.0, 39));  // the first step overflowed
  EXPECT_EQ(testing::compare(finals[1], finals[0]).max_abs, 0.0);
}

// bfloat16 has float32's range: the same 2^40 scale that overflows the fp16 hook passes the bf16 hook, and every
// rank steps every time, the replicas equal.
TEST(GradScalerRanks, Bf16HookCarriesTheScaleThatOverflowsFloat16) {
  testing::Scenario s;
  s.options.comm_hook = ddp::make_bf16_compress_hook();
  std::vector<std::vector<torch::Tensor>> finals(2);
  std::vector<std::string> refusals(2);
  testing::run_thread_ranks(2, [&](int rank, comm::Communicator& communicator) {
    testing::Net net = testing::make_net(s, /*seed=*/7 + rank);
    ddp::DistributedDataParallel<testing::Net> model(net, borrow(communicator), s.options);
    auto optimizer = testing::make_sgd(model.parameters());
    GradScalerOptions options;
    options.init_scale = std::pow(2.0, 40);
    GradScaler scaler(options, borrow(communicator));
    for (int step = 0; step < 10 && refusals[rank].empty(); ++step) {
      testing::Batch batch = testing::full_batch(s, step);
      optimizer.zero_grad();
      try {
        scaler.scale(torch::mse_loss(model(batch.x.narrow(0, rank * s.batch_per_rank, s.batch_per_rank)),
                                     batch.y.narrow(0, rank * s.batch_per_rank, s.batch_per_rank)))
            .backward();
      } catch (const UnsupportedError& error) {
        refusals[rank] = error.what();
        return;
      }
      EXPECT_TRUE(scaler.step(optimizer)) << "rank " << rank << " step " << step;
      scaler.update();
    }
    EXPECT_EQ(scaler.get_scale(), std::pow(2.0, 40));
    finals[rank] = testing::snapshot(*model.module());
  });
  // LibTorch 1.13's Gloo has no bfloat16 reduction, and says so on every rank.
  if (!refusals[0].empty() || !refusals[1].empty()) {
    for (const auto& refusal : refusals) EXPECT_NE(refusal.find("does not support BFloat16"), std::string::npos) << refusal;
    GTEST_SKIP() << refusals[0];
  }
  EXPECT_EQ(testing::compare(finals[1], finals[0]).max_abs, 0.0);
}

}  // namespace
}  // namespace tandem::amp
