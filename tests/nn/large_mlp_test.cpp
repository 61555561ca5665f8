// `--model mlp-100m`, the benchmarks' model with a large checkpoint: its size, which the benchmark's figures
// depend on, and its forward shape.
#include <gtest/gtest.h>

#include "tandem/nn/model_registry.h"

namespace tandem {
namespace {

TEST(LargeMlp, HoldsAbout100MillionParametersAndClassifiesImages) {
  nn::Model model = nn::make_model("mlp-100m", nn::ModelOptions{10, 1, 28});
  int64_t parameters = 0;
  for (const torch::Tensor& parameter : model.module.ptr()->parameters()) parameters += parameter.numel();
  // 784x8192 + 8192x8192 + 8192x3072 + 3072x10, with their biases.
  EXPECT_EQ(parameters, 98747402);
  const torch::Tensor logits = model.module.forward(torch::rand({2, 1, 28, 28}));
  EXPECT_EQ(logits.sizes(), (std::vector<int64_t>{2, 10}));
  EXPECT_EQ(model.head_prefixes, std::vector<std::string>{"output."});
}

}  // namespace
}  // namespace tandem
