// Autocast: what runs in which dtype inside and after the scope, the setting carried to another thread, the
// weight-cast cache across steps, and the clear refusal of what a LibTorch version cannot do.
#include "tandem/amp/autocast.h"

#include <gtest/gtest.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <limits>
#include <string>
#include <thread>

#include "support/gpu.h"
#include "tandem/amp/grad_scaler.h"
#include "tandem/amp/precision.h"
#include "tandem/util/error.h"

namespace tandem::amp {
namespace {

torch::ScalarType product_dtype() {
  const torch::Tensor a = torch::ones({2, 2});
  return torch::mm(a, a).scalar_type();
}

TEST(Autocast, RunsMatrixProductsInBfloat16OnTheCpuAndRestoresOnExit) {
  torch::manual_seed(0);
  torch::nn::Linear linear(4, 3);
  const torch::Tensor x = torch::randn({2, 4});
  {
    Autocast autocast(torch::kCPU, torch::kBFloat16);
    const torch::Tensor y = linear(x);
    EXPECT_EQ(y.scalar_type(), torch::kBFloat16);
    // Losses run in float32 inside the scope.
    EXPECT_EQ(torch::nn::functional::cross_entropy(y, torch::tensor({0, 2})).scalar_type(), torch::kFloat32);
    {
      Autocast off(torch::kCPU, torch::kBFloat16, /*enabled=*/false);
      EXPECT_EQ(product_dtype(), torch::kFloat32);
    }
    EXPECT_EQ(product_dtype(), torch::kBFloat16);
    torch::nn::functional::cross_entropy(y, torch::tensor({0, 2})).backward();
  }
  EXPECT_EQ(product_dtype(), torch::kFloat32);
  EXPECT_FALSE(current_autocast().cpu.enabled);
  // Weights and their gradients stay float32.
  EXPECT_EQ(linear->weight.grad().scalar_type(), torch::kFloat32);
}

TEST(Autocast, ReachesAnotherThreadOnlyThroughAutocastSettingsScope) {
  Autocast autocast(torch::kCPU, torch::kBFloat16);
  const AutocastSettings settings = current_autocast();
  torch::ScalarType bare = torch::kDouble, carried = torch::kDouble;
  std::thread([&] {
    bare = product_dtype();
    AutocastSettingsScope scope(settings);
    carried = product_dtype();
  }).join();
  EXPECT_EQ(bare, torch::kFloat32);
  EXPECT_EQ(carried, torch::kBFloat16);
}

// Autocast caches each weight's bfloat16 copy for the scope; the next step's scope must see updated weights.
TEST(Autocast, ANewScopeSeesWeightsChangedSinceTheLast) {
  torch::nn::Linear linear(torch::nn::LinearOptions(2, 1).bias(false));
  const torch::Tensor x = torch::ones({1, 2});
  torch::Tensor before, after;
  {
    Autocast autocast(torch::kCPU, torch::kBFloat16);
    before = linear(x);
  }
  {
    torch::NoGradGuard no_grad;
    linear->weight.fill_(2.0);
  }
  {
    Autocast autocast(torch::kCPU, torch::kBFloat16);
    after = linear(x);
  }
  EXPECT_EQ(after.item<float>(), 4.0f);
  EXPECT_NE(before.item<float>(), after.item<float>());
}

TEST(Autocast, RequireAutocastAcceptsWhatRunsAndRefusesTheRestInOneLine) {
  EXPECT_NO_THROW(require_autocast(torch::kCPU, torch::kBFloat16));
#if TORCH_VERSION_MAJOR >= 2
  EXPECT_NO_THROW(require_autocast(torch::kCPU, torch::kHalf));
#else
  try {
    require_autocast(torch::kCPU, torch::kHalf);
    ADD_FAILURE() << "float16 autocast on 1.13's CPU was accepted";
  } catch (const UnsupportedError& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("bf16-mixed"), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
#endif
  EXPECT_THROW(require_autocast(torch::Device("meta"), torch::kBFloat16), UnsupportedError);
  EXPECT_THROW(Autocast(torch::kCPU, torch::kFloat64), UnsupportedError);
}

// The CUDA path: float16 autocast, and the scaler's fused unscale kernel on GPU gradients.
TEST(AutocastOnGpu, Float16ForwardAndAScaledStepThatSkipsAnInf) {
  TANDEM_SKIP_WITHOUT_GPU();
  const torch::Device gpu(torch::kCUDA, 0);
  require_autocast(gpu, torch::kHalf);
  torch::nn::Linear linear(4, 3);
  linear->to(gpu);
  torch::optim::SGD optimizer(linear->parameters(), torch::optim::SGDOptions(0.1));
  GradScaler scaler;
  const torch::Tensor x = torch::randn({5, 4}, gpu);
  torch::Tensor loss;
  {
    Autocast autocast(torch::kCUDA, torch::kHalf);
    const torch::Tensor y = linear(x);
    EXPECT_EQ(y.scalar_type(), torch::kHalf);
    loss = y.to(torch::kFloat32).pow(2).mean();
  }
  scaler.scale(loss).backward();
  EXPECT_EQ(linear->weight.grad().scalar_type(), torch::kFloat32);
  const torch::Tensor before = linear->weight.detach().clone();
  EXPECT_TRUE(scaler.step(optimizer));
  scaler.update();
  EXPECT_FALSE(torch::equal(before, linear->weight.detach()));

  optimizer.zero_grad();
  scaler.scale(linear(x).sum() * std::numeric_limits<float>::infinity()).backward();
  const torch::Tensor kept = linear->weight.detach().clone();
  EXPECT_FALSE(scaler.step(optimizer));
  scaler.update();
  EXPECT_TRUE(torch::equal(kept, linear->weight.detach()));
  EXPECT_EQ(scaler.get_scale(), 32768.0);
}

TEST(Precision, ParsesLightningsSpellingsAndRefusesOthers) {
  EXPECT_EQ(parse_precision("32"), Precision::kFloat32);
  EXPECT_EQ(parse_precision("bf16-mixed"), Precision::kBf16Mixed);
  EXPECT_EQ(parse_precision("16-mixed"), Precision::kFloat16Mixed);
  for (const char* bad : {"16", "bf16", "fp16", "64", ""}) EXPECT_THROW(parse_precision(bad), InvalidArgument) << bad;
  EXPECT_EQ(autocast_dtype(Precision::kFloat16Mixed), torch::kHalf);
  EXPECT_FALSE(autocast_dtype(Precision::kFloat32).has_value());
  EXPECT_TRUE(uses_loss_scaling(Precision::kFloat16Mixed));
  EXPECT_FALSE(uses_loss_scaling(Precision::kBf16Mixed));
}

}  // namespace
}  // namespace tandem::amp
