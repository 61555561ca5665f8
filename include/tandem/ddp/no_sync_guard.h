#pragma once
// Gradient accumulation without communication, PyTorch's `with model.no_sync():`. While the guard lives,
// forwards run through DistributedDataParallel mark their backward as local: .grad accumulates and nothing is
// sent. The first synchronised backward afterwards reduces the accumulated sum, so k micro-batches (each
// loss scaled by 1/k) reproduce one large batch. Forward and backward of a micro-batch both belong inside the
// guard's scope.
#include "tandem/ddp/reducer.h"

namespace tandem::ddp {

class NoSyncGuard {
 public:
  explicit NoSyncGuard(Reducer& reducer) : reducer_(&reducer), previous_(reducer.require_sync()) {
    reducer.set_require_sync(false);
  }
  ~NoSyncGuard() {
    if (reducer_) reducer_->set_require_sync(previous_);
  }
  NoSyncGuard(NoSyncGuard&& other) noexcept : reducer_(other.reducer_), previous_(other.previous_) {
    other.reducer_ = nullptr;
  }
  NoSyncGuard(const NoSyncGuard&) = delete;
  NoSyncGuard& operator=(const NoSyncGuard&) = delete;
  NoSyncGuard& operator=(NoSyncGuard&&) = delete;

 private:
  Reducer* reducer_;
  bool previous_;
};

}  // namespace tandem::ddp
