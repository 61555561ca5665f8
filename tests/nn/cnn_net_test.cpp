// The seeds' CNNNet: PyTorch-compatible names and shapes, logits out, and the model registry around it.
#include <gtest/gtest.h>

#include "tandem/nn/cnn_net.h"
#include "tandem/nn/model_registry.h"
#include "tandem/nn/sync_batch_norm.h"
#include "tandem/util/error.h"

namespace tandem::nn {
namespace {

TEST(CnnNet, ParameterNamesAndShapesMatchTheSeedsPyTorchModule) {
  CnnNet net;
  // What `CNNNet(1, 16, 32, 32, 128, 64, 10).state_dict()` holds in PyTorch, in the same order.
  const std::vector<std::pair<std::string, std::vector<int64_t>>> expected = {
      {"conv1.weight", {16, 1, 5, 5}}, {"conv1.bias", {16}},    {"conv2.weight", {32, 16, 5, 5}},
      {"conv2.bias", {32}},            {"conv3.weight", {32, 32, 5, 5}}, {"conv3.bias", {32}},
      {"fc1.weight", {128, 800}},      {"fc1.bias", {128}},     {"fc2.weight", {64, 128}},
      {"fc2.bias", {64}},              {"output.weight", {10, 64}}, {"output.bias", {10}},
  };
  auto params = net->named_parameters();
  ASSERT_EQ(params.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(params[i].key(), expected[i].first);
    EXPECT_EQ(params[i].value().sizes().vec(), expected[i].second) << expected[i].first;
  }
  EXPECT_TRUE(net->named_buffers().is_empty());
}

TEST(CnnNet, FeatureSideIsFiveFor28x28) { EXPECT_EQ(CnnNetImpl::feature_side(28), 5); }

TEST(CnnNet, ReturnsLogitsOfShapeBatchByClasses) {
  torch::manual_seed(0);
  CnnNet net;
  torch::Tensor logits = net->forward(torch::randn({3, 1, 28, 28}));
  EXPECT_EQ(logits.sizes().vec(), (std::vector<int64_t>{3, 10}));
  // Softmax outputs would be positive and sum to 1 per row; logits from random weights do not.
  EXPECT_GT(logits.sum(1).sub(1).abs().max().item<double>(), 1e-3);
}

// cnn-bn: the small model with buffers; SyncBatchNorm's conversion must reach the layers forward() runs.
TEST(CnnNet, CnnBnNormalisesAfterEachConvolutionThroughLayersTheConversionSwaps) {
  Model model = make_model("cnn-bn", ModelOptions{});
  torch::nn::Module& module = *model.module.ptr();
  EXPECT_EQ(module.named_buffers().size(), 9u) << "running mean, variance and count of bn1, bn2, bn3";
  const torch::Tensor before = module.named_buffers()["bn1.running_mean"].clone();
  module.train();
  model.module.forward(torch::randn({4, 1, 28, 28}));
  EXPECT_FALSE(torch::equal(before, module.named_buffers()["bn1.running_mean"])) << "forward ran bn1";
  convert_sync_batchnorm(model.module.ptr());
  EXPECT_EQ(count_sync_batchnorm(module), 3);
  const torch::Tensor converted = module.named_buffers()["bn1.running_mean"].clone();
  EXPECT_EQ(model.module.forward(torch::randn({4, 1, 28, 28})).sizes(), (std::vector<int64_t>{4, 10}));
  EXPECT_FALSE(torch::equal(converted, module.named_buffers()["bn1.running_mean"])) << "forward ran the SyncBatchNorm";
}

TEST(ModelRegistry, MakesTheCnnAndRejectsUnknownNames) {
  ModelOptions options;
  options.num_classes = 7;
  Model model = make_model("cnn", options);
  torch::Tensor logits = model.module.forward(torch::zeros({2, 1, 28, 28}));
  EXPECT_EQ(logits.size(1), 7);
  try {
    make_model("no-such-model");
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& error) {
    EXPECT_NE(std::string(error.what()).find("cnn"), std::string::npos) << error.what();
  }
}

TEST(ModelRegistry, FreezeLayersLeavesOnlyTheClassifierTrainable) {
  Model model = make_model("cnn");
  auto trainable = freeze_all_but_head(model);
  EXPECT_EQ(trainable, (std::vector<std::string>{"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias",
                                                 "output.weight", "output.bias"}));
  for (const auto& item : model.module.ptr()->named_parameters()) {
    EXPECT_EQ(item.value().requires_grad(), item.key().rfind("conv", 0) != 0) << item.key();
  }
}

}  // namespace
}  // namespace tandem::nn
