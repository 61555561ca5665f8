// ResNet-18 with SyncBatchNorm under DDP on 2 thread-ranks trains to the same weights and running statistics as
// one process with plain BatchNorm on the concatenated batch (what `tandem train --sync-bn` relies on), and
// torchvision-style weights with another classifier size load with fc.* skipped and listed (--init).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <mutex>

#include "ddp/ddp_fixtures.h"
#include "support/thread_ranks.h"
#include "tandem/checkpoint/safetensors.h"
#include "tandem/checkpoint/weights.h"
#include "tandem/nn/resnet.h"
#include "tandem/nn/sync_batch_norm.h"
#include "tandem/util/error.h"

namespace tandem {
namespace {

using testing::compare;
using testing::Difference;

void copy_state(const torch::nn::Module& from, torch::nn::Module& to) {
  torch::NoGradGuard no_grad;
  auto params = to.named_parameters(), buffers = to.named_buffers();
  for (const auto& p : from.named_parameters()) params[p.key()].copy_(p.value());
  for (const auto& b : from.named_buffers()) buffers[b.key()].copy_(b.value());
}

std::vector<torch::Tensor> buffers_of(const torch::nn::Module& module) {
  std::vector<torch::Tensor> values;
  for (const auto& b : module.named_buffers()) values.push_back(b.value().detach().to(torch::kDouble));
  return values;
}

constexpr int kWorld = 2;
constexpr int64_t kPerRank = 3;
constexpr int64_t kClasses = 4;
constexpr int kSteps = 3;

// Step `step`'s whole batch: kWorld * kPerRank images of 32x32 (layer4 sees 1x1, the smallest ResNet input).
// Float64 throughout: with 6 values per channel at layer4, float32 rounding differences (1e-5 after one step)
// grow about a thousandfold per SGD step through the 20 BatchNorm layers, which would hide a real mismatch
// behind a loose tolerance; in float64 the two trainings agree to about 1e-11.
std::pair<torch::Tensor, torch::Tensor> whole_batch(int step) {
  auto gen = testing::generator(500 + step);
  return {torch::randn({kWorld * kPerRank, 3, 32, 32}, gen).to(torch::kDouble),
          torch::randint(kClasses, {kWorld * kPerRank}, gen)};
}

TEST(ResNetDdp, SyncBatchNormOnTwoRanksEqualsBatchNormOnTheConcatenatedBatch) {
  torch::manual_seed(21);
  nn::ResNet initial = nn::resnet18(kClasses);
  initial->to(torch::kDouble);

  nn::ResNet reference = nn::resnet18(kClasses);
  reference->to(torch::kDouble);
  copy_state(*initial, *reference);
  auto reference_sgd = testing::make_sgd(reference->parameters());
  for (int step = 0; step < kSteps; ++step) {
    auto [x, y] = whole_batch(step);
    reference_sgd.zero_grad();
    torch::nn::functional::cross_entropy(reference(x), y).backward();
    reference_sgd.step();
  }
  const auto expected_params = testing::snapshot(*reference);
  const auto expected_buffers = buffers_of(*reference);

  std::mutex mutex;
  Difference worst_params, worst_buffers;
  int converted = 0;
  testing::run_thread_ranks(kWorld, [&](int rank, comm::Communicator& communicator) {
    nn::ResNet local = nn::resnet18(kClasses);
    local->to(torch::kDouble);
    copy_state(*initial, *local);
    const comm::CommunicatorPtr shared = testing::borrow(communicator);
    nn::convert_sync_batchnorm(local.ptr(), shared);
    ddp::DistributedDataParallel<nn::ResNet> model(local, shared);
    auto sgd = testing::make_sgd(model.parameters());
    for (int step = 0; step < kSteps; ++step) {
      auto [x, y] = whole_batch(step);
      sgd.zero_grad();
      // Mean over this rank's rows; DDP averages over the equal-sized ranks: the whole batch's mean.
      torch::nn::functional::cross_entropy(model(x.narrow(0, rank * kPerRank, kPerRank)),
                                           y.narrow(0, rank * kPerRank, kPerRank))
          .backward();
      sgd.step();
    }
    const Difference params = compare(testing::snapshot(*local), expected_params);
    const Difference buffers = compare(buffers_of(*local), expected_buffers);
    std::lock_guard<std::mutex> lock(mutex);
    converted = nn::count_sync_batchnorm(*local);
    worst_params.max_abs = std::max(worst_params.max_abs, params.max_abs);
    worst_params.max_rel = std::max(worst_params.max_rel, params.max_rel);
    worst_buffers.max_abs = std::max(worst_buffers.max_abs, buffers.max_abs);
    worst_buffers.max_rel = std::max(worst_buffers.max_rel, buffers.max_rel);
  });
  std::cout << "[ largest difference ] after " << kSteps << " steps: parameters " << worst_params.max_abs
            << " (relative " << worst_params.max_rel << "), running stats " << worst_buffers.max_abs << " (relative "
            << worst_buffers.max_rel << ")\n";
  EXPECT_EQ(converted, 20) << "ResNet-18 has 20 BatchNorm layers";
  EXPECT_LT(worst_params.max_rel, 1e-9);
  EXPECT_LT(worst_buffers.max_rel, 1e-9);
}

TEST(ResNetDdp, TorchvisionWeightsWithAnotherClassCountSkipFcAndSayWhich) {
  // A 1000-class ResNet-18 saved with torchvision's names stands in for converted ImageNet weights.
  torch::manual_seed(3);
  nn::ResNet imagenet = nn::resnet18(1000);
  const std::string path =
      ::testing::TempDir() + "tandem_resnet_init_" + std::to_string(::getpid()) + ".safetensors";
  checkpoint::save_weights(*imagenet, path);

  nn::ResNet model = nn::resnet18(10);
  const checkpoint::LoadReport report = checkpoint::load_weights(*model, path);
  // --strict refuses the same file instead, naming the tensors.
  try {
    checkpoint::load_weights(*model, path, /*strict=*/true);
    ADD_FAILURE() << "strict loading accepted a 1000-class fc";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("fc.weight"), std::string::npos) << e.what();
  }
  std::remove(path.c_str());

  ASSERT_EQ(report.skipped.size(), 2u);
  for (const std::string& skipped : report.skipped) EXPECT_EQ(skipped.rfind("fc.", 0), 0u) << skipped;
  EXPECT_TRUE(report.missing.empty()) << "fc's tensors are in the file: skipped for their shape, not missing";
  EXPECT_EQ(report.loaded.size(), model->named_parameters().size() + model->named_buffers().size() - 2);
  EXPECT_TRUE(torch::equal(model->named_parameters()["layer4.1.conv2.weight"],
                           imagenet->named_parameters()["layer4.1.conv2.weight"]));
}

}  // namespace
}  // namespace tandem
