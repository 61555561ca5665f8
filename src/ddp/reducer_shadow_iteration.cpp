// Reducer::shadow_iteration (reducer.h, ddp/join.h): a rank out of data answers the collectives of the others'
// synchronised iteration with zero gradients, and takes the gradient they agreed on.
#include "tandem/ddp/reducer.h"

#include <torch/torch.h>

#include <algorithm>

#include "tandem/util/error.h"
#include "unused_parameter_error.h"

namespace tandem::ddp {

int Reducer::shadow_iteration() {
  if (world_size_ == 1) return 0;
  std::lock_guard<std::mutex> lock(mutex_);
  if (!broken_.empty()) throw CommError(broken_);
  TANDEM_CHECK(!callback_queued_, "shadow_iteration during backward");
  synchronise_forward(/*participating=*/false);
  torch::NoGradGuard no_grad;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    buckets_[b].buffer.narrow(0, 0, layouts_[b].numel).zero_();
    buckets_[b].pending = 0;
  }
  std::fill(used_since_sync_.begin(), used_since_sync_.end(), 0);
  local_unused_error_ = false;
  shadowing_ = true;
  TailAgreement agreement;
  try {
    agreement = reduce_buckets();
  } catch (...) {
    shadowing_ = false;
    throw;
  }
  shadowing_ = false;
  reset_iteration();
  if (!agreement.ranks_missing.empty()) throw_unused_parameters(rank_, {}, agreement.ranks_missing);
  if (agreement.trained_ranks > 0) {
    average_over_trained(agreement.trained_ranks);
    write_back(agreement.globally_used);
  }
  after_agreement(agreement);
  return agreement.trained_ranks;
}

}  // namespace tandem::ddp
