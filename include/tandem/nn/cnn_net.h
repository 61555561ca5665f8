#pragma once
// The seeds' CNNNet: three 5x5 convolutions (padding 1) with two 2x2 max-pools (padding 1) and a three-layer
// fully connected classifier. forward() returns LOGITS: the seeds' softmax before CrossEntropyLoss applied
// softmax twice, which flattens the gradients; take softmax yourself if you need probabilities.
// Submodule names match the seed's PyTorch module (conv1, conv2, conv3, fc1, fc2, output), so the state dict
// names (`conv1.weight`, ..., `output.bias`) move between tandem and PyTorch unchanged.
#include <torch/nn/cloneable.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/pooling.h>
#include <torch/nn/pimpl.h>

namespace tandem::nn {

struct CnnNetOptions {
  int64_t in_channels = 1;
  int64_t conv1_channels = 16;
  int64_t conv2_channels = 32;
  int64_t conv3_channels = 32;
  int64_t fc1_features = 128;
  int64_t fc2_features = 64;
  int64_t num_classes = 10;
  // Height and width of the (square) input; fixes fc1's input size (28 -> 5*5*conv3_channels = 800).
  int64_t image_size = 28;
  // A BatchNorm2d after each convolution (bn1, bn2, bn3): the small model with buffers that SyncBatchNorm and
  // the buffer broadcast act on (`tandem train --model cnn-bn`). The seeds' CNNNet has none.
  bool batch_norm = false;
};

// Cloneable, so that dp::DataParallel can copy it onto its replicas.
class CnnNetImpl : public torch::nn::Cloneable<CnnNetImpl> {
 public:
  explicit CnnNetImpl(const CnnNetOptions& options = {});

  // Builds the layers anew from the options (Cloneable's contract: clone() calls it on a copy).
  void reset() override;

  // x: [N, in_channels, image_size, image_size] -> logits [N, num_classes].
  torch::Tensor forward(torch::Tensor x);

  // Side of the last feature map for a square input of `image_size` (5 for 28).
  static int64_t feature_side(int64_t image_size);

 private:
  CnnNetOptions options_;
  torch::nn::Conv2d conv1_{nullptr}, conv2_{nullptr}, conv3_{nullptr};
  torch::nn::MaxPool2d pool1_{nullptr}, pool2_{nullptr};
  torch::nn::Linear fc1_{nullptr}, fc2_{nullptr}, output_{nullptr};
};
TORCH_MODULE(CnnNet);

}  // namespace tandem::nn
