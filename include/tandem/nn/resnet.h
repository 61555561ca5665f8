#pragma once
// ResNet-18 and ResNet-34 (BasicBlock) with torchvision's module tree, so parameter and buffer names match
// torchvision's state dict exactly (conv1.weight, bn1.running_mean, layer1.0.conv1.weight,
// layer2.0.downsample.0.weight, layer2.0.downsample.1.running_var, ..., fc.weight, fc.bias) and converted
// torchvision weights load by name. tests/fixtures/resnet*_state_dict.txt lists them (made by
// tests/fixtures/make_resnet_names.py).
//
// Norm layers are BatchNorm2d, looked up by name at each forward (forward_batch_norm), so
// convert_sync_batchnorm(model) turns them into SyncBatchNorm in place.
#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

namespace tandem::nn {

struct ResNetOptions {
  // Blocks per stage: {2, 2, 2, 2} is ResNet-18, {3, 4, 6, 3} ResNet-34.
  std::vector<int64_t> blocks_per_stage = {2, 2, 2, 2};
  int64_t num_classes = 1000;
  // torchvision's zero_init_residual: start each block's last BN weight at 0 (off, as torchvision).
  bool zero_init_residual = false;
};

// conv3x3-bn-relu-conv3x3-bn plus the shortcut (a 1x1 conv + bn "downsample" where shape changes), then relu.
class BasicBlockImpl : public torch::nn::Module {
 public:
  BasicBlockImpl(int64_t in_channels, int64_t out_channels, int64_t stride);
  torch::Tensor forward(const torch::Tensor& input);

 private:
  torch::nn::Conv2d conv1_{nullptr}, conv2_{nullptr};
  // The downsample's 1x1 conv; its norm layer is child "1" of the "downsample" module.
  std::shared_ptr<torch::nn::Module> downsample_;
  torch::nn::Conv2d downsample_conv_{nullptr};
};
TORCH_MODULE(BasicBlock);

class ResNetImpl : public torch::nn::Module {
 public:
  explicit ResNetImpl(const ResNetOptions& options);
  // Input [N, 3, H, W] (any H, W >= 32 or so); output logits [N, num_classes].
  torch::Tensor forward(const torch::Tensor& input);

  const ResNetOptions& options() const { return options_; }

 private:
  ResNetOptions options_;
  torch::nn::Conv2d conv1_{nullptr};
  torch::nn::MaxPool2d maxpool_{nullptr};
  std::vector<torch::nn::Sequential> stages_;
  torch::nn::Linear fc_{nullptr};
};
TORCH_MODULE(ResNet);

ResNet resnet18(int64_t num_classes = 1000);
ResNet resnet34(int64_t num_classes = 1000);
// "resnet18" or "resnet34"; anything else throws InvalidArgument listing the known names.
ResNet make_resnet(const std::string& name, int64_t num_classes);
std::vector<std::string> resnet_names();

}  // namespace tandem::nn
