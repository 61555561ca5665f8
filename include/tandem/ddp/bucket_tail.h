#pragma once
// The reducer's bookkeeping for one synchronised iteration (docs/reducer.md, "The tail"): world_size error
// flags (rank r sets slot r when a parameter got no gradient without find_unused_parameters), world_size
// "trained" flags (rank r sets slot world_size + r unless it shadows), then, during the unused-parameter search,
// one "used since the last sync" flag per parameter. Each is read as zero or not, so a mean or a sum serves
// alike. With a hook that averages plainly (is_plain_average) and a float32 or float64 last bucket, the tail
// rides at the end of that bucket and tells every rank what the others saw at no extra collective; with any
// other hook it must not be rounded or compressed, so it is summed in float32 in an all-reduce of its own,
// launched right after the last bucket.
//
// Part of the Reducer (reducer.h), which calls it with its mutex held.
#include <torch/types.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "tandem/comm/communicator.h"

namespace tandem::ddp {

// What every rank reads from the tail once all buckets are reduced.
struct TailAgreement {
  std::vector<int> ranks_missing;   // ranks with parameters that got no gradient (an error)
  int trained_ranks = 0;            // ranks that ran a real backward (fewer once some shadow)
  int highest_trained_rank = -1;    // -1 when every rank shadowed
  std::vector<char> globally_used;  // per parameter, during the unused-parameter search only
};

class BucketTail {
 public:
  // Sizes the tail for `world_size` ranks, with a used flag for each of `param_count` parameters when
  // `unused_search`; `last_bucket_device` is where the last bucket lives (none: no buckets). The last bucket must
  // then leave numel() elements of room after its gradients.
  void allocate(int world_size, size_t param_count, bool unused_search,
                const std::optional<torch::Device>& last_bucket_device);
  int64_t numel() const { return numel_; }

  // Decides whether the tail rides in `last_bucket` (its first `payload_numel` elements are the gradients),
  // anew whenever the hook or the buckets change. Returns what the comm hook is handed of that bucket: the
  // payload, with the tail where it rides.
  torch::Tensor place(const torch::Tensor& last_bucket, int64_t payload_numel, bool plain_average_hook);

  // Right before the last bucket's launch: writes this rank's flags where they travel. The previous
  // iteration's copy has completed, since read() read its result back.
  void fill(int rank, bool unused_parameter_error, bool trained, const std::vector<char>& used_since_sync);
  // Right after the last bucket's launch: the tail's own all-reduce, where it does not ride.
  void launch(comm::Communicator& communicator);
  // The tail's own all-reduce in flight, if any.
  const comm::WorkPtr& work() const { return work_; }
  void reset() { work_.reset(); }

  // Once every bucket (and work()) has completed.
  TailAgreement read();

 private:
  torch::Tensor on_wire();

  int world_size_ = 1;
  size_t param_count_ = 0;
  bool used_flags_ = false;
  int64_t numel_ = 0;
  bool rides_ = false;
  torch::Tensor last_bucket_;  // where it rides
  int64_t payload_numel_ = 0;  // where it starts in last_bucket_
  torch::Tensor wire_;         // float32, on the last bucket's device, where it does not ride
  comm::WorkPtr work_;
  // Filled on the host, then copied onto the wire. Pinned when the last bucket is on a GPU, so that the copy is
  // queued without blocking (a pageable copy would make the host wait for all of backward's kernels).
  torch::Tensor host_;
};

}  // namespace tandem::ddp
