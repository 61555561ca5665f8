#include "tandem/nn/cnn_net.h"

#include <torch/nn/functional/activation.h>

#include "tandem/nn/model_registry.h"
#include "tandem/nn/sync_batch_norm.h"
#include "tandem/util/error.h"

namespace tandem::nn {

namespace {
constexpr int64_t kConvPadding = 1;
torch::nn::Conv2dOptions conv5x5(int64_t in, int64_t out) {
  return torch::nn::Conv2dOptions(in, out, 5).stride(1).padding(kConvPadding);
}
torch::nn::MaxPool2dOptions pool2x2() { return torch::nn::MaxPool2dOptions(2).stride(2).padding(1); }
}  // namespace

int64_t CnnNetImpl::feature_side(int64_t image_size) {
  // conv 5x5 padding 1 shrinks by 2; pool 2 stride 2 padding 1 maps s to floor(s / 2) + 1.
  int64_t side = image_size - 2;
  side = side / 2 + 1;
  side -= 2;
  side = side / 2 + 1;
  side -= 2;
  return side;
}

CnnNetImpl::CnnNetImpl(const CnnNetOptions& options) : options_(options) {
  if (feature_side(options.image_size) < 1) {
    throw InvalidArgument(detail::concat("CnnNet needs images of at least 10x10 pixels, got ", options.image_size));
  }
  reset();
}

void CnnNetImpl::reset() {
  const int64_t side = feature_side(options_.image_size);
  // Registration order is the state dict order of the seed's module.
  conv1_ = register_module("conv1", torch::nn::Conv2d(conv5x5(options_.in_channels, options_.conv1_channels)));
  pool1_ = register_module("pool1", torch::nn::MaxPool2d(pool2x2()));
  conv2_ = register_module("conv2", torch::nn::Conv2d(conv5x5(options_.conv1_channels, options_.conv2_channels)));
  pool2_ = register_module("pool2", torch::nn::MaxPool2d(pool2x2()));
  conv3_ = register_module("conv3", torch::nn::Conv2d(conv5x5(options_.conv2_channels, options_.conv3_channels)));
  if (options_.batch_norm) {
    register_module("bn1", torch::nn::BatchNorm2d(options_.conv1_channels));
    register_module("bn2", torch::nn::BatchNorm2d(options_.conv2_channels));
    register_module("bn3", torch::nn::BatchNorm2d(options_.conv3_channels));
  }
  fc1_ = register_module("fc1", torch::nn::Linear(side * side * options_.conv3_channels, options_.fc1_features));
  fc2_ = register_module("fc2", torch::nn::Linear(options_.fc1_features, options_.fc2_features));
  output_ = register_module("output", torch::nn::Linear(options_.fc2_features, options_.num_classes));
}

// On the CPU the layers run as oneDNN convolutions on channels-last (NHWC) tensors, which LibTorch 1.13 hands to
// oneDNN as they are; an NCHW tensor is reordered into oneDNN's blocked layout and back at every call, and its
// max-pool has no vectorised kernel. The weights stay NCHW parameters (checkpoints, DDP's buckets and the
// optimizer see what they always saw): each call converts a copy, a few thousand floats, inside autograd.
// The classifier runs as convolutions too: fc1 covers the whole feature map, so it is a convolution with fc1's
// weight viewed as [out, channels, side, side], and fc2 and output are 1x1 convolutions. The sums are the
// same as Linear's; oneDNN computes them several times faster than the reference BLAS that Debian's LibTorch
// uses for matrix products (docs/benchmarks.md). On a GPU the layers are called as written: cuDNN and cuBLAS
// choose their own layouts. A batch of no rows (a rank whose images were all unreadable, which still joins the
// step) is called as written too: LibTorch 1.13's convolution of an empty batch views its output in the weight's
// layout, which channels-last refuses ("view size is not compatible with input tensor's size and stride").
torch::Tensor CnnNetImpl::forward(torch::Tensor x) {
  const bool on_cpu = x.is_cpu() && x.size(0) > 0;
  // Norm layers are looked up by name at each call, so that convert_sync_batchnorm's swap counts.
  const auto normalised = [&](const char* name, const torch::Tensor& y) {
    return options_.batch_norm ? forward_batch_norm(*named_children()[name], y) : y;
  };
  const auto convolved = [&](torch::nn::Conv2d& conv, const torch::Tensor& input) {
    if (!on_cpu) return conv(input);
    const torch::Tensor& w = conv->weight;
    return torch::conv2d(input, w.to(w.options(), false, false, torch::MemoryFormat::ChannelsLast), conv->bias,
                         /*stride=*/1, kConvPadding);
  };
  // Max-pooling commutes with ReLU (both are monotone, and ties keep the same element), so the ReLU runs on the
  // pooled map, a quarter of the size, in place: the pool's backward needs its indices, not its output.
  x = pool1_(normalised("bn1", convolved(conv1_, x))).relu_();
  x = pool2_(normalised("bn2", convolved(conv2_, x))).relu_();
  // A BatchNorm's backward may keep its output, so only a convolution's output is overwritten.
  x = normalised("bn3", convolved(conv3_, x));
  x = options_.batch_norm ? torch::relu(x) : x.relu_();
  if (!on_cpu) {
    x = x.flatten(1);
    x = torch::relu(fc1_(x));
    x = torch::relu(fc2_(x));
    return output_(x);
  }
  const auto fully_connected = [](const torch::nn::Linear& layer, const torch::Tensor& input) {
    const torch::Tensor& w = layer->weight;
    return torch::conv2d(input, w.view({w.size(0), input.size(1), input.size(2), input.size(3)}), layer->bias);
  };
  x = fully_connected(fc1_, x).relu_();
  x = fully_connected(fc2_, x).relu_();
  return fully_connected(output_, x).flatten(1);
}

namespace {
// --freeze-layers trains the fully connected classifier (fc1, fc2, output) and freezes the convolutions.
Model make_cnn(const ModelOptions& o, bool batch_norm) {
  CnnNetOptions options;
  options.in_channels = o.in_channels;
  options.num_classes = o.num_classes;
  options.image_size = o.image_size;
  options.batch_norm = batch_norm;
  return Model{torch::nn::AnyModule(CnnNet(options)), {"fc1.", "fc2.", "output."}};
}

const ModelRegistration kRegisterCnn("cnn", "the seeds' CNNNet (3 conv + 3 fc, ~0.15M parameters)",
                                     [](const ModelOptions& o) { return make_cnn(o, false); });
const ModelRegistration kRegisterCnnBn("cnn-bn", "the seeds' CNNNet with a BatchNorm after each convolution",
                                       [](const ModelOptions& o) { return make_cnn(o, true); });
}  // namespace

}  // namespace tandem::nn
