#pragma once
// The hook point through which each gradient bucket is reduced across ranks. The reducer calls launch() on
// the autograd thread the moment a bucket is complete and keeps the returned Work in flight while backward
// goes on; at the end of backward it calls wait() on every bucket's Work, in bucket order.
//
// Contract: after wait(), bucket.buffer must hold the element-wise mean over all ranks of the buffers they
// passed in (the whole buffer). The reducer's bookkeeping (which ranks trained, which failed) reaches a hook
// only where is_plain_average() says that a mean leaves it exact; every other hook gets gradients alone.
// The average and fp16/bf16 hooks may be shared by several models; they keep per-bucket scratch space keyed by
// the buffer. PowerSGD (ddp/powersgd_hook.h) keeps per-model state and serves one model.
#include <torch/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tandem/comm/communicator.h"

namespace tandem::ddp {

struct GradBucket {
  size_t index = 0;          // 0 is launched first
  size_t bucket_count = 0;
  torch::Tensor buffer;      // flat, one dtype; reduced in place
  // Views into `buffer`, shaped like the bucket's parameters, in the order they lie in it, for hooks that work
  // per parameter. Elements of `buffer` after the last view (only for a hook whose is_plain_average() is true)
  // are the reducer's bookkeeping: average them like the rest.
  std::vector<torch::Tensor> gradients;
  // The model (its reducer) whose bucket this is: a hook that keeps state per model tells a rebuild of that
  // model's buckets (new buffers for the same indices) from another model's buckets by it.
  const void* model = nullptr;
};

class CommHook {
 public:
  virtual ~CommHook() = default;
  virtual std::string name() const = 0;
  virtual comm::WorkPtr launch(comm::Communicator& communicator, const GradBucket& bucket) = 0;
  // True when wait() leaves each element the plain mean of the ranks' elements, computed in the buffer's dtype
  // (make_average_hook). Only then does the reducer let its bookkeeping ride in a float32 or float64 last bucket;
  // for any other hook it sums the bookkeeping in float32 in an all-reduce of its own, so that compression or
  // rounding (bf16 rounds 1/48 summed 48 times to 47/48) never reaches it.
  virtual bool is_plain_average() const { return false; }

  // Bytes this hook has handed to all-reduces since it was made, over every bucket and model it served: what a
  // rank contributes per step is the difference across that step (a ring all-reduce then moves about twice
  // that over each rank's link). Only what goes through all_reduce() below is counted.
  int64_t bytes_all_reduced() const { return bytes_all_reduced_.load(); }

 protected:
  comm::WorkPtr all_reduce(comm::Communicator& communicator, torch::Tensor& tensor, comm::ReduceOp op);

 private:
  std::atomic<int64_t> bytes_all_reduced_{0};
};
using CommHookPtr = std::shared_ptr<CommHook>;

// All-reduce with ReduceOp::Avg in the bucket's own dtype (PyTorch's default).
CommHookPtr make_average_hook();
// Casts the bucket to float16 / bfloat16 (pre-divided by the world size, so the sum cannot overflow), sums
// that, and casts back: half the bytes on the wire, at the cost of precision.
CommHookPtr make_fp16_compress_hook();
CommHookPtr make_bf16_compress_hook();

// A Work that runs `then` once, after `inner` has completed (the decompression step of a hook).
comm::WorkPtr then(comm::WorkPtr inner, std::function<void()> continuation);

}  // namespace tandem::ddp
