#include "tandem/ddp/bucket_rebuild.h"

#include <torch/torch.h>

#include "tandem/comm/value_collectives.h"

namespace tandem::ddp {

void BucketRebuild::decide(int trained_ranks, const std::vector<char>& globally_used, bool find_unused_parameters,
                           bool static_graph) {
  if (rebuilt_ || due_ || trained_ranks == 0) return;
  // With the unused-parameter search on, the order changes from iteration to iteration; PyTorch rebuilds then
  // only for a static graph, and so do we.
  if (find_unused_parameters && !static_graph) return;
  due_ = true;
  used_in_first_iteration_ = globally_used;
}

std::vector<size_t> BucketRebuild::agreed_order(comm::Communicator& communicator, size_t param_count,
                                                bool static_graph) const {
  torch::Tensor order = torch::empty({static_cast<int64_t>(param_count)}, torch::kLong);
  int64_t* out = order.data_ptr<int64_t>();
  std::vector<char> placed(param_count, 0);
  for (size_t index : ready_order_) {
    *out++ = static_cast<int64_t>(index);
    placed[index] = 1;
  }
  // Parameters without a gradient in that backward (or all of them on a rank that shadowed it) keep the
  // reverse registration order, after the others.
  for (size_t i = param_count; i-- > 0;) {
    if (!placed[i]) *out++ = static_cast<int64_t>(i);
  }
  comm::broadcast_values(communicator, order, 0);
  std::vector<size_t> walk;
  const int64_t* agreed = order.data_ptr<int64_t>();
  for (int64_t i = 0; i < order.numel(); ++i) {
    const auto index = static_cast<size_t>(agreed[i]);
    if (static_graph && !used_in_first_iteration_.empty() && !used_in_first_iteration_[index]) continue;
    walk.push_back(index);
  }
  return walk;
}

void BucketRebuild::complete() {
  due_ = false;
  rebuilt_ = true;
  ready_order_ = {};
  used_in_first_iteration_ = {};
}

}  // namespace tandem::ddp
