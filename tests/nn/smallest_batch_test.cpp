// The smallest batches every registered model must take in training mode: a batch of no rows, which a rank
// whose images were all unreadable (--skip-bad-images) still runs forward and backward so as to join the step's
// collectives, and the smallest batch that trains (one sample, or two through BatchNorm, whose training statistics
// need more than one value per channel).
#include <gtest/gtest.h>

#include "tandem/nn/model_registry.h"
#include "tandem/nn/sync_batch_norm.h"

namespace tandem::nn {
namespace {

// RGB at 32x32: a shape every registered model takes (the ResNets' last BatchNorm then sees 1x1 pixels).
Model make_registered(const std::string& name) {
  torch::manual_seed(0);
  Model model = make_model(name, ModelOptions{/*num_classes=*/10, /*in_channels=*/3, /*image_size=*/32});
  model.module.ptr()->train();
  return model;
}

class SmallestBatch : public ::testing::TestWithParam<std::string> {};

// LibTorch 1.13's CNN failed with "view size is not compatible with input tensor's size and stride" on a batch of
// no rows: --skip-bad-images ended the run when one batch lost every image after good ones.
TEST_P(SmallestBatch, NoRowsGiveNoLogitsAndAZeroGradient) {
  Model model = make_registered(GetParam());
  const torch::Tensor logits = model.module.forward(torch::zeros({0, 3, 32, 32}));
  EXPECT_EQ(logits.sizes().vec(), (std::vector<int64_t>{0, 10}));
  // What the loop differentiates for such a batch: the rank's gradient is zero, and defined for its all-reduce.
  (logits.sum() * 0.0).backward();
  for (const auto& parameter : model.module.ptr()->named_parameters()) {
    ASSERT_TRUE(parameter.value().grad().defined()) << parameter.key();
    EXPECT_EQ(parameter.value().grad().abs().sum().item<double>(), 0.0) << parameter.key();
  }
}

TEST_P(SmallestBatch, TheSmallestBatchThatTrainsGivesFiniteLogits) {
  Model model = make_registered(GetParam());
  const int64_t smallest = has_batch_norm(*model.module.ptr()) ? 2 : 1;
  const torch::Tensor logits = model.module.forward(torch::randn({smallest, 3, 32, 32}));
  EXPECT_EQ(logits.sizes().vec(), (std::vector<int64_t>{smallest, 10}));
  EXPECT_TRUE(logits.isfinite().all().item<bool>());
}

std::vector<std::string> registered_names() {
  std::vector<std::string> names;
  for (const auto& [name, description] : registered_models()) names.push_back(name);
  return names;
}

INSTANTIATE_TEST_SUITE_P(EveryRegisteredModel, SmallestBatch, ::testing::ValuesIn(registered_names()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name = info.param;
                           for (char& c : name) c = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
                           return name;
                         });

}  // namespace
}  // namespace tandem::nn
