#include "tandem/ddp/comm_hook.h"

#include <functional>
#include <mutex>
#include <unordered_map>
#include <utility>

namespace tandem::ddp {
namespace {

class ThenWork : public comm::Work {
 public:
  ThenWork(comm::WorkPtr inner, std::function<void()> continuation)
      : inner_(std::move(inner)), continuation_(std::move(continuation)) {}

  void wait() override {
    if (done_) return;
    inner_->wait();
    continuation_();
    done_ = true;
  }
  // Completed only once the continuation has run, which happens in wait().
  bool is_completed() override { return done_; }
  // The communication is what a timeline shows; the continuation is local work after it.
  void observe_completion(std::function<void()> observer) override { inner_->observe_completion(std::move(observer)); }

 private:
  comm::WorkPtr inner_;
  std::function<void()> continuation_;
  bool done_ = false;
};

class AverageHook : public CommHook {
 public:
  std::string name() const override { return "average"; }
  bool is_plain_average() const override { return true; }
  comm::WorkPtr launch(comm::Communicator& communicator, const GradBucket& bucket) override {
    torch::Tensor buffer = bucket.buffer;
    return all_reduce(communicator, buffer, comm::ReduceOp::Avg);
  }
};

class CompressionHook : public CommHook {
 public:
  explicit CompressionHook(torch::ScalarType wire_dtype) : wire_dtype_(wire_dtype) {}
  std::string name() const override { return std::string("compress_") + c10::toString(wire_dtype_); }

  comm::WorkPtr launch(comm::Communicator& communicator, const GradBucket& bucket) override {
    // Scratch reused across iterations, keyed by the bucket's own memory: allocated once per bucket, and safe
    // when one hook object serves several models (or several thread ranks).
    torch::Tensor wire;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      torch::Tensor& slot = scratch_[bucket.buffer.data_ptr()];
      if (!slot.defined() || slot.numel() != bucket.buffer.numel()) {
        slot = torch::empty({bucket.buffer.numel()}, bucket.buffer.options().dtype(wire_dtype_));
      }
      wire = slot;
    }
    // Divided in the bucket's own precision before the cast: a gradient above the narrow type's range (65504
    // for float16) that the average brings back into it must not become inf. The bucket is overwritten with
    // the result anyway.
    bucket.buffer.div_(communicator.world_size());
    wire.copy_(bucket.buffer);
    comm::WorkPtr work = all_reduce(communicator, wire, comm::ReduceOp::Sum);
    torch::Tensor buffer = bucket.buffer;
    return then(std::move(work), [buffer, wire]() mutable { buffer.copy_(wire); });
  }

 private:
  torch::ScalarType wire_dtype_;
  std::mutex mutex_;
  std::unordered_map<const void*, torch::Tensor> scratch_;
};

}  // namespace

comm::WorkPtr CommHook::all_reduce(comm::Communicator& communicator, torch::Tensor& tensor, comm::ReduceOp op) {
  bytes_all_reduced_ += tensor.numel() * static_cast<int64_t>(tensor.element_size());
  return communicator.all_reduce(tensor, op);
}

comm::WorkPtr then(comm::WorkPtr inner, std::function<void()> continuation) {
  return std::make_shared<ThenWork>(std::move(inner), std::move(continuation));
}

CommHookPtr make_average_hook() { return std::make_shared<AverageHook>(); }
CommHookPtr make_fp16_compress_hook() { return std::make_shared<CompressionHook>(torch::kHalf); }
CommHookPtr make_bf16_compress_hook() { return std::make_shared<CompressionHook>(torch::kBFloat16); }

}  // namespace tandem::ddp
