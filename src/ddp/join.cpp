#include "tandem/ddp/join.h"

#include <fmt/format.h>

#include "tandem/comm/value_collectives.h"
#include "tandem/nn/sync_batch_norm.h"
#include "tandem/util/error.h"

namespace tandem::ddp {

Join::Join(const torch::nn::Module& module, Reducer& reducer)
    : reducer_(reducer), backwards_at_start_(reducer.synchronised_backwards()) {
  require_joinable(module);
  reducer_.set_uneven_inputs(true);
}

Join::~Join() { reducer_.set_uneven_inputs(false); }

void Join::require_joinable(const torch::nn::Module& module) {
  for (const auto& item : module.named_modules()) {
    if (dynamic_cast<const nn::SyncBatchNormImpl*>(item.value().get()) != nullptr) {
      throw UnsupportedError(fmt::format(
          "Join (uneven inputs) does not support SyncBatchNorm ('{}'): it exchanges batch statistics inside forward, "
          "which a rank without data cannot answer; use BatchNorm, or give every rank the same number of batches "
          "(pad or drop the last samples)",
          item.key().empty() ? "the model" : item.key()));
    }
  }
}

int Join::finish(const std::function<void()>& shadow_step) {
  const comm::CommunicatorPtr& communicator = reducer_.communicator();
  if (!communicator || communicator->world_size() == 1) return 0;
  while (reducer_.shadow_iteration() > 0) {
    if (shadow_step) shadow_step();
  }
  // The ranks that trained longest hold the newest model; they all hold the same one, so any of them will do.
  const int world = communicator->world_size();
  const int64_t trained = reducer_.synchronised_backwards() - backwards_at_start_;
  torch::Tensor candidate = torch::tensor({trained * world + communicator->rank()}, torch::kLong);
  comm::all_reduce_values(*communicator, candidate, comm::ReduceOp::Max);
  const int root = static_cast<int>(candidate.item<int64_t>() % world);
  reducer_.copy_replica_from(root);
  reducer_.set_uneven_inputs(false);
  return root;
}

}  // namespace tandem::ddp
