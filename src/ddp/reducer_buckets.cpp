// The Reducer's bucket storage (reducer.h, docs/reducer.md "Construction" and "Bucket rebuild"): the flat
// buffers of its bucket layouts with each parameter's view of its slice, formed at construction and again at
// the rebuild, and the gradients' way from .grad into the buckets and, reduced, back.
#include "tandem/ddp/reducer.h"

#include <torch/torch.h>

#include "bucket_plan.h"
#include "tandem/util/error.h"

namespace tandem::ddp {
namespace {

bool is_same_storage(const torch::Tensor& a, const torch::Tensor& b) {
  return a.defined() && b.defined() && a.data_ptr() == b.data_ptr() && a.sizes() == b.sizes();
}

std::vector<int64_t> contiguous_strides(const torch::Tensor& tensor) {
  std::vector<int64_t> strides(tensor.dim(), 1);
  for (int64_t d = tensor.dim() - 2; d >= 0; --d) strides[d] = strides[d + 1] * tensor.size(d + 1);
  return strides;
}

}  // namespace

// The flat buffers of layouts_, each parameter's view of its slice, and the tail's places.
void Reducer::allocate_buckets() {
  tail_.allocate(world_size_, params_.size(), unused_search_,
                 layouts_.empty() ? std::nullopt : std::optional<torch::Device>(layouts_.back().device));
  torch::NoGradGuard no_grad;
  for (auto& param : params_) {
    param.bucket = kNoBucket;
    param.bucket_view = torch::Tensor();
  }
  buckets_.clear();
  buckets_.resize(layouts_.size());
  spans_.resize(layouts_.size());
  for (size_t b = 0; b < layouts_.size(); ++b) {
    const BucketLayout& layout = layouts_[b];
    const bool last = b + 1 == layouts_.size();
    buckets_[b].buffer = torch::zeros({layout.numel + (last ? tail_.numel() : 0)},
                                      torch::TensorOptions().dtype(layout.dtype).device(layout.device));
    for (size_t k = 0; k < layout.params.size(); ++k) {
      Param& param = params_[layout.params[k]];
      param.bucket = b;
      // Aliases the bucket's storage without being an autograd view, so that .grad can be this tensor and
      // still be detach_()-ed and zeroed by LibTorch 1.13's Optimizer::zero_grad().
      param.bucket_view = torch::empty({0}, buckets_[b].buffer.options())
                              .set_(buckets_[b].buffer.storage(), layout.offsets[k], param.tensor.sizes(),
                                    contiguous_strides(param.tensor));
      if (options_.gradient_as_bucket_view && param.tensor.grad().defined()) {
        param.bucket_view.copy_(param.tensor.grad());
        param.tensor.mutable_grad() = param.bucket_view;
      }
      buckets_[b].for_hook.gradients.push_back(param.bucket_view);
    }
    buckets_[b].for_hook.index = b;
    buckets_[b].for_hook.bucket_count = layouts_.size();
    buckets_[b].for_hook.buffer = buckets_[b].buffer.narrow(0, 0, layout.numel);
    buckets_[b].for_hook.model = this;
  }
  place_tail();
}

void Reducer::place_tail() {
  if (buckets_.empty()) return;
  buckets_.back().for_hook.buffer =
      tail_.place(buckets_.back().buffer, layouts_.back().numel, options_.comm_hook->is_plain_average());
}

void Reducer::rebuild_buckets() {
  const std::vector<size_t> walk = rebuild_.agreed_order(*communicator_, params_.size(), options_.static_graph);
  std::vector<torch::Tensor> trainable;
  for (const auto& param : params_) trainable.push_back(param.tensor);
  layouts_ = plan_buckets(options_, trainable, &walk);
  if (options_.static_graph) unused_search_ = false;
  allocate_buckets();
  reset_iteration();
  rebuild_.complete();
}

void Reducer::copy_grad_into_bucket(Param& param) {
  torch::NoGradGuard no_grad;
  const torch::Tensor& grad = param.tensor.grad();
  if (!grad.defined()) {
    param.bucket_view.zero_();
  } else if (grad.is_sparse()) {
    throw UnsupportedError("DistributedDataParallel does not support sparse gradients ('" + param.name + "')");
  } else if (!is_same_storage(grad, param.bucket_view)) {
    param.bucket_view.copy_(grad);
  }
}

// Ranks that shadowed this iteration sent zeros: the comm hook's mean over the world becomes the mean over the
// ranks that trained. The same arithmetic on the same reduced buckets on every rank, shadowing or not.
void Reducer::average_over_trained(int trained_ranks) {
  if (trained_ranks == world_size_) return;
  torch::NoGradGuard no_grad;
  const double rescale = static_cast<double>(world_size_) / trained_ranks;
  for (size_t b = 0; b < buckets_.size(); ++b) buckets_[b].buffer.narrow(0, 0, layouts_[b].numel).mul_(rescale);
}

void Reducer::write_back(const std::vector<char>& globally_used) {
  for (size_t i = 0; i < params_.size(); ++i) {
    // A parameter no rank used keeps its .grad as it was, as in a single process.
    if (!globally_used.empty() && !globally_used[i]) continue;
    Param& param = params_[i];
    if (param.bucket == kNoBucket) continue;  // static_graph found it unused
    torch::Tensor& grad = param.tensor.mutable_grad();
    if (options_.gradient_as_bucket_view) {
      if (!is_same_storage(grad, param.bucket_view)) grad = param.bucket_view;
    } else if (grad.defined()) {
      grad.copy_(param.bucket_view);
    } else {
      grad = param.bucket_view.clone();
    }
  }
}

}  // namespace tandem::ddp
