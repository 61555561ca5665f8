// `--model mlp-100m`: a plain MLP of about 100M parameters on 28x28 images (784 -> 8192 -> 8192 -> 3072 -> 10 on
// MNIST files: 98.7M). Nobody trains MNIST with it for accuracy: it is the model whose checkpoint is large
// (0.4 GB of weights, 0.8 GB with SGD's momentum), for measuring what moving a whole training state costs
// (`tandem bench recovery --model mlp-100m`: a restart reads it back from disk, in-job recovery sends it to the
// replacement over the network).
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include "tandem/nn/model_registry.h"

namespace tandem::nn {
namespace {

class LargeMlpImpl : public torch::nn::Module {
 public:
  explicit LargeMlpImpl(const ModelOptions& o)
      : fc1_(register_module("fc1", torch::nn::Linear(o.in_channels * o.image_size * o.image_size, 8192))),
        fc2_(register_module("fc2", torch::nn::Linear(8192, 8192))),
        fc3_(register_module("fc3", torch::nn::Linear(8192, 3072))),
        output_(register_module("output", torch::nn::Linear(3072, o.num_classes))) {}

  torch::Tensor forward(const torch::Tensor& images) {
    torch::Tensor x = fc1_(images.flatten(1)).relu_();
    x = fc2_(x).relu_();
    x = fc3_(x).relu_();
    return output_(x);
  }

 private:
  torch::nn::Linear fc1_, fc2_, fc3_, output_;
};
TORCH_MODULE(LargeMlp);

// --freeze-layers trains the output layer alone.
const ModelRegistration kRegisterLargeMlp(
    "mlp-100m", "an MLP of ~100M parameters (4 fully connected layers), whose checkpoint is large: for benchmarks",
    [](const ModelOptions& o) { return Model{torch::nn::AnyModule(LargeMlp(o)), {"output."}}; });

}  // namespace
}  // namespace tandem::nn
