#pragma once
// ResNet-18 and ResNet-34 (BasicBlock) with torchvision's module tree, so parameter and buffer names match
// torchvision's state dict exactly (conv1.weight, bn1.running_mean, layer1.0.conv1.weight,
// layer2.0.downsample.0.weight, layer2.0.downsample.1.running_var, ..., fc.weight, fc.bias) and converted
// torchvision weights load by name. tests/fixtures/resnet*_state_dict.txt lists them (made by
// tests/fixtures/make_resnet_names.py).
//
// Norm layers are BatchNorm2d, looked up by name at each forward (forward_batch_norm), so
// convert_sync_batchnorm(model) turns them into SyncBatchNorm in place.
//
// Every module here is a torch::nn::Cloneable, so that dp::DataParallel can copy a ResNet onto its replicas.
// Cloneable's contract shapes them: each builds its layers in reset(), and keeps handles only to its own
// children, since clone() copies a child's tree into the child in place but replaces the grandchildren.
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

// What a BasicBlock, and its Downsample, are built from.
struct BlockShape {
  int64_t in_channels, out_channels, stride;
};

// The shortcut where the shape changes: a 1x1 convolution (child "0") and its norm layer (child "1"). Not
// nn::Sequential, whose forward would keep calling the original BatchNorm after convert_sync_batchnorm.
class DownsampleImpl : public torch::nn::Cloneable<DownsampleImpl> {
 public:
  explicit DownsampleImpl(const BlockShape& shape);
  void reset() override;
  torch::Tensor forward(const torch::Tensor& input);

 private:
  BlockShape shape_;
  torch::nn::Conv2d conv_{nullptr};
};
TORCH_MODULE(Downsample);

// conv3x3-bn-relu-conv3x3-bn plus the shortcut (the input, or its Downsample), then relu.
class BasicBlockImpl : public torch::nn::Cloneable<BasicBlockImpl> {
 public:
  BasicBlockImpl(int64_t in_channels, int64_t out_channels, int64_t stride);
  void reset() override;
  torch::Tensor forward(const torch::Tensor& input);

 private:
  BlockShape shape_;
  torch::nn::Conv2d conv1_{nullptr}, conv2_{nullptr};
  Downsample downsample_{nullptr};  // null where the shape stays
};
TORCH_MODULE(BasicBlock);

class ResNetImpl : public torch::nn::Cloneable<ResNetImpl> {
 public:
  explicit ResNetImpl(const ResNetOptions& options);
  void reset() override;
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
