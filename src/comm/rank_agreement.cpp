#include "tandem/comm/rank_agreement.h"

#include "tandem/comm/value_collectives.h"
#include "tandem/util/error.h"

namespace tandem::comm {

void agree_or_throw(std::exception_ptr local_failure, Communicator* communicator, const std::string& what) {
  if (!communicator || communicator->world_size() < 2) {
    if (local_failure) std::rethrow_exception(local_failure);
    return;
  }
  torch::Tensor failed = torch::zeros({communicator->world_size()}, torch::kFloat64);
  if (local_failure) failed[communicator->rank()] = 1.0;
  all_reduce_values(*communicator, failed, ReduceOp::Sum);
  if (local_failure) std::rethrow_exception(local_failure);
  for (int r = 0; r < communicator->world_size(); ++r) {
    if (failed[r].item<double>() > 0) throw Error(detail::concat("rank ", r, " failed ", what, "; stopping"));
  }
}

std::string rank0_string(Communicator* communicator, const std::string& value) {
  return communicator ? broadcast_string(*communicator, value) : value;
}

}  // namespace tandem::comm
