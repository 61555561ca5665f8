// FSDP's mixed precision (FsdpOptions::mixed_precision): bfloat16 compute over float32 master shards follows a
// reference computed by hand; reducing in bfloat16 rounds the average that float32 keeps exact; the gathers move
// and hold half the bytes; 16-mixed's loss scaler skips a step that overflowed on one rank's shard on every rank;
// and `tandem train --strategy fsdp --precision bf16-mixed` trains, checkpoints and continues.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "fsdp_fixtures.h"
#include "support/processes.h"
#include "support/tiny_datasets.h"
#include "tandem/amp/autocast.h"
#include "tandem/amp/grad_scaler.h"
#include "tandem/checkpoint/safetensors.h"
#include "tandem/fsdp/unit_plan.h"
#include "tandem/util/error.h"

namespace tandem::testing {
namespace {

// SGD with momentum on 2 ranks, bfloat16 parameters, gradients reduced in `reduce_dtype`.
FsdpScenario bf16_scenario(torch::ScalarType reduce_dtype) {
  FsdpScenario s;
  s.world = 2;
  s.steps = 5;
  s.options.mixed_precision.param_dtype = torch::kBFloat16;
  s.options.mixed_precision.reduce_dtype = reduce_dtype;
  return s;
}

// What FSDP computes, by hand in one thread: each rank's gradient from a bfloat16 copy of the float32 masters on
// its own batch, the ranks' gradients averaged in float32. Returns the averaged gradient by parameter name.
std::map<std::string, torch::Tensor> averaged_bf16_gradient(const FsdpScenario& s, int step, nn::CnnNet& replica,
                                                            const NamedTensors& masters) {
  std::map<std::string, torch::Tensor> sum;
  for (int rank = 0; rank < s.world; ++rank) {
    {
      torch::NoGradGuard no_grad;
      auto parameters = replica->named_parameters();
      for (const auto& [name, master] : masters) {
        parameters[name].copy_(master);
        parameters[name].mutable_grad() = torch::Tensor();
      }
    }
    Batch batch = rank_batch(s, step, 0, rank);
    torch::nn::functional::cross_entropy(replica->forward(batch.x.to(torch::kBFloat16)), batch.y).backward();
    for (const auto& entry : replica->named_parameters()) {
      const torch::Tensor half = entry.value().grad().to(torch::kFloat32) / s.world;
      sum[entry.key()] = sum.count(entry.key()) ? sum[entry.key()] + half : half;
    }
  }
  return sum;
}

nn::CnnNet bf16_replica() {
  nn::CnnNet replica = make_cnn(7);
  replica->to(torch::kBFloat16);
  return replica;
}

// Every bfloat16 operation of the FSDP run is the reference's, on the same values and shapes; what may differ is
// the order in which float32 adds the ranks' halves (a backend's reduction against the reference's loop), one
// float32 rounding per step. 1e-6 is far below bfloat16's 4e-3 and far above that.
TEST(FsdpMixedPrecision, Bf16OnTwoRanksFollowsTheReferenceComputedByHand) {
  const FsdpScenario s = bf16_scenario(torch::kFloat32);
  const NamedTensors fsdp = run_fsdp(s);

  NamedTensors masters = initial_parameters(s);
  std::vector<torch::Tensor> master_tensors;
  for (auto& [name, tensor] : masters) master_tensors.push_back(tensor.requires_grad_(true));
  auto optimizer = make_optimizer(s, master_tensors);
  nn::CnnNet replica = bf16_replica();
  for (int step = 0; step < s.steps; ++step) {
    std::map<std::string, torch::Tensor> gradient = averaged_bf16_gradient(s, step, replica, masters);
    for (auto& [name, tensor] : masters) tensor.mutable_grad() = gradient.at(name);
    optimizer->step();
  }
  const double difference = relative_l2(fsdp, masters);
  std::printf("[fsdp bf16] 2 ranks, 5 steps, against the reference by hand: relative L2 %.3g\n", difference);
  EXPECT_LE(difference, 1e-6);
}

// One backward on 2 ranks, its shard gradients gathered whole on every rank, with the reduce dtype given. Empty
// with `refusal` set where the backend cannot reduce it.
std::map<std::string, torch::Tensor> reduced_gradient(torch::ScalarType reduce_dtype, std::string& refusal) {
  const FsdpScenario s = bf16_scenario(reduce_dtype);
  std::map<std::string, torch::Tensor> result;
  run_thread_ranks(2, [&](int rank, comm::Communicator& communicator) {
    std::unique_ptr<fsdp::FullyShardedDataParallel<nn::CnnNet>> model;
    try {
      model = std::make_unique<fsdp::FullyShardedDataParallel<nn::CnnNet>>(make_cnn(7 + rank), borrow(communicator),
                                                                          s.options);
    } catch (const UnsupportedError& error) {
      if (rank == 0) refusal = error.what();
      return;
    }
    Batch batch = rank_batch(s, 0, 0, rank);
    torch::nn::functional::cross_entropy((*model)(batch.x), batch.y).backward();
    for (const auto& unit : model->sharded().units()) {
      EXPECT_EQ(unit->shard().grad().scalar_type(), torch::kFloat32) << "shard gradients stay float32";
      torch::Tensor full = torch::empty({unit->padded_numel()});
      communicator.all_gather_into(full, unit->shard().grad())->wait();
      if (rank != 0) continue;
      for (const auto& parameter : unit->parameters()) {
        result[parameter.name] = full.narrow(0, parameter.offset, parameter.numel).view(parameter.shape);
      }
    }
  });
  return result;
}

// A float32 reduction gives the average of the ranks' bfloat16 gradients exactly (halving is exact, the sum of
// two halves rounds once in float32, as the reference's); a bfloat16 one gives that average rounded to bfloat16:
// within one bfloat16 step of it, and not equal to the float32 result everywhere. 1.13's Gloo reduces no
// bfloat16: there the refusal is checked and float16 shows the same with its own step. The base averages by
// halving each input first, so where float16's halves fall below its normal range they round too: two roundings
// at most, so the largest relative difference stays within two steps.
TEST(FsdpMixedPrecision, ReducingInLowPrecisionRoundsTheAverageThatFloat32KeepsExact) {
  const FsdpScenario s = bf16_scenario(torch::kFloat32);
  nn::CnnNet replica = bf16_replica();
  const std::map<std::string, torch::Tensor> expected = averaged_bf16_gradient(s, 0, replica, initial_parameters(s));

  std::string refusal;
  const auto float32 = reduced_gradient(torch::kFloat32, refusal);
  ASSERT_TRUE(refusal.empty()) << refusal;
  double float32_difference = 0;
  for (const auto& [name, value] : expected) {
    float32_difference = std::max(float32_difference, (float32.at(name) - value).abs().max().item<double>());
  }
  EXPECT_LE(float32_difference, 1e-9);

  auto low = reduced_gradient(torch::kBFloat16, refusal);
  torch::ScalarType low_dtype = torch::kBFloat16;
  if (!refusal.empty()) {
    EXPECT_NE(refusal.find("fsdp reduce_dtype bfloat16 needs a backend that reduces bfloat16, and gloo in this build "
                           "does not; set mixed_precision.reduce_dtype to float32"),
              std::string::npos)
        << refusal;
    refusal.clear();
    low = reduced_gradient(torch::kHalf, refusal);
    low_dtype = torch::kHalf;
    ASSERT_TRUE(refusal.empty()) << refusal;
  }
  // One step of the dtype at |value|, and at least its smallest normal's step (float16's subnormals).
  const double epsilon = low_dtype == torch::kBFloat16 ? std::ldexp(1.0, -7) : std::ldexp(1.0, -10);
  const double smallest_normal = low_dtype == torch::kBFloat16 ? 1.1754944e-38 : 6.1035156e-05;
  bool differs = false;
  double largest_relative = 0;
  for (const auto& [name, value] : expected) {
    const torch::Tensor got = low.at(name);
    const torch::Tensor allowed = value.abs().clamp_min(smallest_normal) * epsilon;
    EXPECT_TRUE((got - value.to(low_dtype).to(torch::kFloat32)).abs().le(allowed).all().item<bool>()) << name;
    differs = differs || !torch::equal(got, float32.at(name));
    largest_relative =
        std::max(largest_relative, ((got - value).abs() / value.abs().clamp_min(smallest_normal)).max().item<double>());
  }
  std::printf("[fsdp reduce dtype] %s reduction: largest relative difference from float32's %.3g (one step %.3g)\n",
              c10::toString(low_dtype), largest_relative, epsilon);
  EXPECT_TRUE(differs) << "a low-precision reduction must round somewhere";
  EXPECT_LE(largest_relative, 2 * epsilon);
}

// The masters (the optimizer's parameters and their gradients) stay float32; the module computes in bfloat16, and
// the gathered vectors take half the bytes of float32's, at their peak too.
TEST(FsdpMixedPrecision, MastersStayFloat32AndTheGathersHoldHalfTheBytes) {
  std::map<torch::ScalarType, int64_t> peak, unit_bytes;
  run_thread_ranks(2, [&](int rank, comm::Communicator& communicator) {
    for (torch::ScalarType dtype : {torch::kFloat32, torch::kBFloat16}) {
      fsdp::FsdpOptions options;
      options.mixed_precision.param_dtype = dtype;
      options.mixed_precision.reduce_dtype = torch::kFloat32;
      fsdp::FullyShardedDataParallel<nn::CnnNet> model(make_cnn(5), borrow(communicator), options);
      Batch batch = rank_batch(FsdpScenario{}, 0, 0, rank);
      torch::Tensor output = model(batch.x);
      EXPECT_EQ(output.scalar_type(), dtype) << "the module computes in the param dtype";
      torch::nn::functional::cross_entropy(output, batch.y).backward();
      for (const torch::Tensor& shard : model.parameters()) {
        EXPECT_EQ(shard.scalar_type(), torch::kFloat32);
        EXPECT_EQ(shard.grad().scalar_type(), torch::kFloat32);
      }
      if (rank != 0) continue;
      peak[dtype] = model.sharded().peak_unsharded_bytes();
      for (const auto& unit : model.sharded().units()) unit_bytes[dtype] += unit->unsharded_bytes();
    }
  });
  std::printf("[fsdp bf16 memory] peak gathered: float32 %lld bytes, bfloat16 %lld bytes\n",
              static_cast<long long>(peak[torch::kFloat32]), static_cast<long long>(peak[torch::kBFloat16]));
  EXPECT_EQ(2 * unit_bytes[torch::kBFloat16], unit_bytes[torch::kFloat32]);
  EXPECT_EQ(2 * peak[torch::kBFloat16], peak[torch::kFloat32]);
}

// BatchNorm refuses low-precision weights beside its float32 running statistics (LibTorch 1.13 and 2.x): its
// parameters form float32 units of their own, which take the bfloat16 activations as they come.
TEST(FsdpMixedPrecision, BatchNormsKeepFloat32UnitsAndTrain) {
  FsdpScenario s;
  s.model = "resnet18";
  s.batch_per_rank = 2;
  s.steps = 2;
  s.options.mixed_precision.param_dtype = torch::kBFloat16;
  s.options.mixed_precision.reduce_dtype = torch::kFloat32;
  s.options.units.module_types = {"BasicBlock"};
  run_thread_ranks(2, [&](int rank, comm::Communicator& communicator) {
    torch::set_num_threads(1);
    nn::ResNet resnet = make_resnet18(3);
    std::set<std::string> batch_norms;
    for (const auto& entry : resnet->named_modules("", /*include_self=*/false)) {
      if (fsdp::module_type_matches(*entry.value(), {"BatchNorm2d"})) batch_norms.insert(entry.key());
    }
    fsdp::FullyShardedDataParallel<nn::ResNet> model(resnet, borrow(communicator), s.options);
    std::set<std::string> float32_units;
    for (const auto& unit : model.sharded().units()) {
      if (unit->param_dtype() == torch::kFloat32) float32_units.insert(unit->name());
    }
    EXPECT_EQ(float32_units, batch_norms) << "each BatchNorm a float32 unit, every other unit bfloat16";
    auto optimizer = make_optimizer(s, model.parameters());
    train_steps(s, rank, model, *optimizer, [] {});
    for (const auto& [name, value] : model.full_parameters()) {
      EXPECT_TRUE(value.isfinite().all().item<bool>()) << name;
    }
  });
}

// Each BatchNorm's float32 unit runs nested in the unit it was split from (a layer's), which stays gathered
// around it: a forward gathers every unit once, as a float32 forward does, rather than the layer again after each
// of its BatchNorms (before: 15 more gathers of ResNet-18's four layers per forward, 19 where 4 do).
TEST(FsdpMixedPrecision, BatchNormUnitsDoNotMakeTheirLayerGatherAgain) {
  for (torch::ScalarType dtype : {torch::kFloat32, torch::kBFloat16}) {
    fsdp::FsdpOptions options;
    options.mixed_precision.param_dtype = dtype;
    options.mixed_precision.reduce_dtype = torch::kFloat32;
    fsdp::FullyShardedDataParallel<nn::ResNet> model(make_resnet18(3), nullptr, options);
    const torch::Tensor x = torch::randn({2, 3, 32, 32}, generator(5));
    torch::NoGradGuard no_grad;  // no backward follows: the forward's gathers alone
    model(x);  // the first forward learns the order the second one prefetches in
    const auto& units = model.sharded().units();
    std::vector<int64_t> before;
    for (const auto& unit : units) before.push_back(unit->gathers_started());
    model(x);
    int64_t total = 0;
    for (size_t u = 0; u < units.size(); ++u) {
      const int64_t gathers = units[u]->gathers_started() - before[u];
      total += gathers;
      EXPECT_EQ(gathers, 1) << c10::toString(dtype) << " unit " << units[u]->name();
    }
    std::printf("[fsdp gathers] ResNet-18 %s: %zu units, %lld gathers per forward\n", c10::toString(dtype),
                units.size(), static_cast<long long>(total));
  }
}

// A checkpoint's full state points the parameters at float32 values for a moment and then back at their bfloat16
// placeholders; LibTorch's set_data drops a parameter's gradient accumulator when its dtype changes. The next
// backward must still reduce into the shards.
TEST(FsdpMixedPrecision, GradientsStillReachTheShardsAfterParametersChangedDtype) {
  run_thread_ranks(2, [](int rank, comm::Communicator& communicator) {
    fsdp::FsdpOptions options;
    options.mixed_precision.param_dtype = torch::kBFloat16;
    options.mixed_precision.reduce_dtype = torch::kFloat32;
    fsdp::FullyShardedDataParallel<nn::CnnNet> model(make_cnn(5), borrow(communicator), options);
    Batch batch = rank_batch(FsdpScenario{}, 0, 0, rank);
    auto gradients = [&] {
      for (const torch::Tensor& shard : model.parameters()) shard.mutable_grad() = torch::Tensor();
      torch::nn::functional::cross_entropy(model(batch.x), batch.y).backward();
      std::vector<torch::Tensor> result;
      for (const torch::Tensor& shard : model.parameters()) result.push_back(shard.grad());
      return result;
    };
    const std::vector<torch::Tensor> before = gradients();
    {
      fsdp::parameter_use_watch::Pause pause;
      torch::NoGradGuard no_grad;
      for (const auto& unit : model.sharded().units()) {
        for (const auto& parameter : unit->parameters()) {
          const torch::Tensor placeholder = parameter.tensor.detach();
          parameter.tensor.set_data(torch::zeros(parameter.shape));
          parameter.tensor.set_data(placeholder);
        }
      }
    }
    const std::vector<torch::Tensor> after = gradients();
    for (size_t unit = 0; unit < before.size(); ++unit) {
      ASSERT_TRUE(after[unit].defined()) << "unit " << unit << " got no gradient";
      EXPECT_TRUE(torch::equal(after[unit], before[unit])) << "unit " << unit;
    }
  });
}

bool float16_computes_on_cpu() {
  try {
    amp::require_autocast(torch::kCPU, torch::kHalf);
    return true;
  } catch (const UnsupportedError&) {
    return false;
  }
}

// One Linear(4, 1) unit: weight and bias are 5 elements padded to 6, so rank 0 holds weight[0..2] and rank 1
// weight[3], the bias and the padding. Rank 1's input is near the dtype's largest value in its first feature only:
// its gradient of weight[0] overflows, and the averaged reduction puts that inf into rank 0's shard alone. The
// scaler's inf check must agree across the ranks, so both skip the step and both halve the scale. Float16 where
// the CPU computes it (LibTorch 2.x), else bfloat16, which overflows the same way at its own largest value.
TEST(FsdpMixedPrecision, AnOverflowOnOneRankSkipsTheStepOnEveryRank) {
  const torch::ScalarType dtype = float16_computes_on_cpu() ? torch::kHalf : torch::kBFloat16;
  const double largest = dtype == torch::kHalf ? 65504.0 : 3.3895314e38;
  std::vector<int> local_inf(2, -1), stepped(2, -1);
  std::vector<double> scales(2, 0);
  run_thread_ranks(2, [&](int rank, comm::Communicator& communicator) {
    fsdp::FsdpOptions options;
    options.mixed_precision.param_dtype = dtype;
    options.mixed_precision.reduce_dtype = torch::kFloat32;
    fsdp::FullyShardedDataParallel<torch::nn::Sequential> model(torch::nn::Sequential(torch::nn::Linear(4, 1)),
                                                                borrow(communicator), options);
    torch::optim::SGD optimizer(model.parameters(), torch::optim::SGDOptions(0.1));
    amp::GradScalerOptions scaler_options;
    scaler_options.init_scale = 1024;  // float16 holds the loss gradient; 1024 x (largest / 2) does not
    amp::GradScaler scaler(scaler_options, borrow(communicator));
    torch::Tensor x = torch::ones({1, 4});
    if (rank == 1) x[0][0] = largest / 2;
    scaler.scale(model(x).sum()).backward();
    const torch::Tensor before = model.parameters().front().detach().clone();
    local_inf[rank] = !model.parameters().front().grad().isfinite().all().item<bool>();
    stepped[rank] = scaler.step(optimizer);
    scaler.update();
    scales[rank] = scaler.get_scale();
    EXPECT_TRUE(torch::equal(model.parameters().front().detach(), before)) << "rank " << rank << " stepped";
  });
  EXPECT_EQ(local_inf, (std::vector<int>{1, 0})) << "the overflow must land in rank 0's shard only";
  EXPECT_EQ(stepped, (std::vector<int>{0, 0}));
  EXPECT_EQ(scales, (std::vector<double>{512, 512}));
}

// `tandem train --strategy fsdp --precision bf16-mixed` under `tandem run` on 2 ranks: the loss falls over three
// epochs, the saved weights are the float32 masters, and a run stopped inside an epoch continues from its
// checkpoint to the uninterrupted run's weights bit for bit.
TEST(FsdpMixedPrecision, TandemTrainBf16MixedTrainsAndContinuesFromItsCheckpoint) {
  const std::string data = write_tiny_mnist("fsdp_bf16_data", 96, 16);
  const std::string root = make_temp_dir("fsdp_bf16_train");
  auto train = [&](const std::string& run_dir, int steps, const std::string& weights) {
    return run_process({tandem_cli(), "run", "--nproc-per-node", "2", "--", tandem_cli(), "train", "--data", data,
                        "--model", "cnn-bn", "--epochs", "3", "--batch-size", "8", "--threads", "1", "--seed", "5",
                        "--lr", "0.05", "--strategy", "fsdp", "--precision", "bf16-mixed", "--steps",
                        std::to_string(steps), "--no-tensorboard", "--no-report", "--timeout", "60", "--run-dir",
                        root + "/" + run_dir, "--save-weights", weights},
                       {}, std::chrono::seconds(150));
  };
  const ProcessResult whole = train("whole", 18, root + "/whole.safetensors");
  ASSERT_FALSE(whole.timed_out) << whole.output;
  ASSERT_EQ(whole.exit_code, 0) << whole.output;
  std::vector<double> losses;
  const std::regex epoch_line(R"(\[epoch \d+\] loss ([0-9.]+))");
  for (std::sregex_iterator it(whole.output.begin(), whole.output.end(), epoch_line), end; it != end; ++it) {
    losses.push_back(std::stod((*it)[1]));
  }
  ASSERT_EQ(losses.size(), 3u) << whole.output;
  std::printf("[fsdp bf16-mixed] epoch losses %.4f %.4f %.4f\n", losses[0], losses[1], losses[2]);
  EXPECT_LT(losses[2], losses[0]) << whole.output;

  const checkpoint::TensorFile weights = checkpoint::load_safetensors(root + "/whole.safetensors");
  ASSERT_FALSE(weights.tensors.empty());
  for (const auto& [name, tensor] : weights.tensors) {
    if (tensor.is_floating_point()) {
      EXPECT_EQ(tensor.scalar_type(), torch::kFloat32) << name;
    }
  }

  const ProcessResult stopped = train("parts", 8, root + "/stopped.safetensors");
  ASSERT_EQ(stopped.exit_code, 0) << stopped.output;
  const ProcessResult continued = train("parts", 18, root + "/continued.safetensors");
  ASSERT_EQ(continued.exit_code, 0) << continued.output;
  EXPECT_NE(continued.output.find("resuming from"), std::string::npos) << continued.output;
  const checkpoint::TensorFile resumed = checkpoint::load_safetensors(root + "/continued.safetensors");
  ASSERT_EQ(resumed.tensors.size(), weights.tensors.size());
  for (const auto& [name, tensor] : weights.tensors) {
    EXPECT_TRUE(torch::equal(resumed.find(name), tensor)) << name << " differs after the continued run";
  }
}

}  // namespace
}  // namespace tandem::testing
