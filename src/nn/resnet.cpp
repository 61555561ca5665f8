#include "tandem/nn/resnet.h"

#include "tandem/nn/model_registry.h"
#include "tandem/nn/sync_batch_norm.h"
#include "tandem/util/error.h"

namespace tandem::nn {
namespace {

namespace tnn = torch::nn;

tnn::Conv2d conv(int64_t in_channels, int64_t out_channels, int64_t kernel, int64_t stride, int64_t padding) {
  return tnn::Conv2d(
      tnn::Conv2dOptions(in_channels, out_channels, kernel).stride(stride).padding(padding).bias(false));
}

// The layer registered as `name` in `owner`, looked up now (not cached) so a swap by convert_sync_batchnorm counts.
torch::Tensor run_norm(const torch::nn::Module& owner, const std::string& name, const torch::Tensor& input) {
  return forward_batch_norm(*owner.named_children()[name], input);
}

}  // namespace

DownsampleImpl::DownsampleImpl(const BlockShape& shape) : shape_(shape) { reset(); }

void DownsampleImpl::reset() {
  conv_ = register_module("0", conv(shape_.in_channels, shape_.out_channels, 1, shape_.stride, 0));
  register_module("1", tnn::BatchNorm2d(shape_.out_channels));
}

torch::Tensor DownsampleImpl::forward(const torch::Tensor& input) {
  return run_norm(*this, "1", conv_->forward(input));
}

BasicBlockImpl::BasicBlockImpl(int64_t in_channels, int64_t out_channels, int64_t stride)
    : shape_{in_channels, out_channels, stride} {
  reset();
}

void BasicBlockImpl::reset() {
  const auto [in_channels, out_channels, stride] = shape_;
  conv1_ = register_module("conv1", conv(in_channels, out_channels, 3, stride, 1));
  register_module("bn1", tnn::BatchNorm2d(out_channels));
  conv2_ = register_module("conv2", conv(out_channels, out_channels, 3, 1, 1));
  register_module("bn2", tnn::BatchNorm2d(out_channels));
  if (stride != 1 || in_channels != out_channels) {
    downsample_ = register_module("downsample", Downsample(shape_));
  }
}

torch::Tensor BasicBlockImpl::forward(const torch::Tensor& input) {
  torch::Tensor out = torch::relu(run_norm(*this, "bn1", conv1_->forward(input)));
  out = run_norm(*this, "bn2", conv2_->forward(out));
  return torch::relu(out + (downsample_ ? downsample_->forward(input) : input));
}

ResNetImpl::ResNetImpl(const ResNetOptions& options) : options_(options) {
  if (options.blocks_per_stage.size() != 4 || options.num_classes < 1) {
    throw InvalidArgument(detail::concat("ResNet needs 4 stages and num_classes >= 1, got ",
                                         options.blocks_per_stage.size(), " stages and ", options.num_classes,
                                         " classes"));
  }
  reset();

  // torchvision's initialisation: He-normal (fan_out) convolutions, BatchNorm at weight 1 and bias 0 (their
  // default), Linear left at its default.
  torch::NoGradGuard no_grad;
  for (auto& module : modules(/*include_self=*/false)) {
    if (auto* c = module->as<tnn::Conv2d>()) {
      tnn::init::kaiming_normal_(c->weight, 0.0, torch::kFanOut, torch::kReLU);
    }
  }
  if (options_.zero_init_residual) {
    for (auto& stage : stages_) {
      for (auto& block : stage->children()) {
        block->named_parameters(/*recurse=*/true)["bn2.weight"].zero_();
      }
    }
  }
}

void ResNetImpl::reset() {
  stages_.clear();
  conv1_ = register_module("conv1", conv(3, 64, 7, 2, 3));
  register_module("bn1", tnn::BatchNorm2d(64));
  maxpool_ = register_module("maxpool", tnn::MaxPool2d(tnn::MaxPool2dOptions(3).stride(2).padding(1)));
  int64_t in_channels = 64;
  for (size_t stage = 0; stage < 4; ++stage) {
    const int64_t out_channels = 64 << stage;
    tnn::Sequential blocks;
    for (int64_t b = 0; b < options_.blocks_per_stage[stage]; ++b) {
      const int64_t stride = (stage > 0 && b == 0) ? 2 : 1;
      blocks->push_back(BasicBlock(in_channels, out_channels, stride));
      in_channels = out_channels;
    }
    stages_.push_back(register_module("layer" + std::to_string(stage + 1), blocks));
  }
  fc_ = register_module("fc", tnn::Linear(512, options_.num_classes));
}

torch::Tensor ResNetImpl::forward(const torch::Tensor& input) {
  if (input.dim() != 4 || input.size(1) != 3) {
    throw InvalidArgument(detail::concat("ResNet expects input [N, 3, H, W], got ", input.sizes()));
  }
  torch::Tensor x = torch::relu(run_norm(*this, "bn1", conv1_->forward(input)));
  x = maxpool_->forward(x);
  for (auto& stage : stages_) x = stage->forward(x);
  x = torch::adaptive_avg_pool2d(x, {1, 1}).flatten(1);
  return fc_->forward(x);
}

ResNet resnet18(int64_t num_classes) { return ResNet(ResNetOptions{{2, 2, 2, 2}, num_classes}); }
ResNet resnet34(int64_t num_classes) { return ResNet(ResNetOptions{{3, 4, 6, 3}, num_classes}); }

std::vector<std::string> resnet_names() { return {"resnet18", "resnet34"}; }

ResNet make_resnet(const std::string& name, int64_t num_classes) {
  if (name == "resnet18") return resnet18(num_classes);
  if (name == "resnet34") return resnet34(num_classes);
  throw InvalidArgument("unknown model '" + name + "'; known: resnet18, resnet34");
}

namespace {

// `--model resnet18|resnet34`; --freeze-layers trains only `fc`, the torchvision classifier.
Model registered_resnet(const std::string& name, const ModelOptions& o) {
  if (o.in_channels != 3) {
    throw InvalidArgument(detail::concat(name, " takes RGB images (3 channels) but the data has ", o.in_channels,
                                         "; for MNIST files write an image folder first (tandem export-images DIR) and "
                                         "train on that"));
  }
  return Model{torch::nn::AnyModule(make_resnet(name, o.num_classes)), {"fc."}};
}

const ModelRegistration kRegisterResNet18("resnet18", "ResNet-18 (torchvision names, 11.7M parameters; RGB images)",
                                          [](const ModelOptions& o) { return registered_resnet("resnet18", o); });
const ModelRegistration kRegisterResNet34("resnet34", "ResNet-34 (torchvision names, 21.8M parameters; RGB images)",
                                          [](const ModelOptions& o) { return registered_resnet("resnet34", o); });

}  // namespace

}  // namespace tandem::nn
