#pragma once
// The one interface every backend (gloo, mpi, nccl) implements. Collectives are asynchronous: each call
// enqueues the operation and returns a Work handle; the tensors passed in must stay alive and untouched until
// wait() returns. Every rank must issue the same collectives in the same order.
#include <torch/types.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace tandem::comm {

enum class ReduceOp { Sum, Avg, Min, Max };
std::string to_string(ReduceOp op);

// A pending collective. wait() blocks until it has completed on this rank and rethrows its failure as
// CommError / TimeoutError naming the operation. After wait(), the output tensors hold the result.
class Work {
 public:
  virtual ~Work() = default;
  virtual void wait() = 0;
  virtual bool is_completed() = 0;
  // Calls `observer` once, as soon as this rank learns that the collective completed: on the backend's own
  // thread where it runs the collective on the host (gloo, mpi), or inside wait() where the host cannot tell
  // earlier (nccl, whose work runs on a GPU stream). For timelines only: the observer must be quick and must not
  // throw, and the caller's tensor may not hold the result yet.
  virtual void observe_completion(std::function<void()> observer) = 0;
};
using WorkPtr = std::shared_ptr<Work>;

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual std::string backend_name() const = 0;
  // Deadline for each collective; a collective not complete by then fails with TimeoutError.
  virtual std::chrono::milliseconds timeout() const = 0;
  // Where this backend wants the tensors it reduces: the CPU for gloo and mpi, the rank's GPU for nccl.
  // Small values (flags, counts, losses) go through comm/value_collectives.h, which stages them there.
  virtual torch::Device device() const { return torch::kCPU; }

  // In place: every rank ends with op applied element-wise over all ranks' `tensor`.
  virtual WorkPtr all_reduce(torch::Tensor& tensor, ReduceOp op = ReduceOp::Sum) = 0;
  // In place: every rank ends with root's `tensor`.
  virtual WorkPtr broadcast(torch::Tensor& tensor, int root = 0) = 0;
  // outputs[r] receives rank r's `input`; outputs must hold world_size() tensors shaped like input.
  virtual WorkPtr all_gather(std::vector<torch::Tensor>& outputs, const torch::Tensor& input) = 0;
  // `input` is world_size() equal chunks along dim 0; rank r receives op over all ranks' chunk r in `output`.
  virtual WorkPtr reduce_scatter(torch::Tensor& output, const torch::Tensor& input, ReduceOp op = ReduceOp::Sum) = 0;
  virtual WorkPtr barrier() = 0;
};
using CommunicatorPtr = std::shared_ptr<Communicator>;

}  // namespace tandem::comm
