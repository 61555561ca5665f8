#pragma once
// The nccl backend: LibTorch's c10d ProcessGroupNCCL, for CUDA tensors, one GPU per rank. Built only against a
// LibTorch with CUDA (TANDEM_HAVE_NCCL). Collectives run on NCCL's own streams, which c10d orders after the
// work already queued on the caller's current stream; wait() makes the current stream wait for the result,
// so the optimizer step that follows sees reduced gradients without a host synchronisation.
#include "tandem/comm/c10d/c10d_communicator.h"
#include "tandem/comm/rank_layout.h"

namespace tandem::comm {

class NcclCommunicator : public C10dCommunicator {
 public:
  NcclCommunicator(StorePtr store, const RankLayout& layout, std::chrono::milliseconds timeout);
};

}  // namespace tandem::comm
