#pragma once
// The communicator every backend (gloo, mpi, nccl) is. Collectives are asynchronous: each call enqueues the
// operation and returns a Work handle; the tensors passed in must stay alive and untouched until wait()
// returns. Every rank must issue the same collectives in the same order.
//
// The public collectives are this class's own, the same for every backend: it checks the arguments, numbers
// the collective for the CollectiveTracker (so that a failure names the ranks that never reached it), fills in
// what a backend lacks (an average, a reduce-scatter) and turns the backend's failures into tandem errors.
// A backend implements only the protected start_* calls below.
#include <torch/types.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tandem/comm/collective_signature.h"
#include "tandem/comm/rendezvous.h"

namespace tandem::comm {

class CollectiveTracker;

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
  virtual ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  const std::string& backend_name() const { return backend_name_; }
  // Deadline for each collective; a collective not complete by then fails with TimeoutError.
  std::chrono::milliseconds timeout() const { return timeout_; }
  // Where this backend wants the tensors it reduces: the CPU for gloo and mpi, the rank's GPU for nccl.
  // Small values (flags, counts, losses) go through comm/value_collectives.h, which stages them there.
  torch::Device device() const { return device_; }

  // In place: every rank ends with op applied element-wise over all ranks' `tensor`.
  WorkPtr all_reduce(torch::Tensor& tensor, ReduceOp op = ReduceOp::Sum);
  // In place: every rank ends with root's `tensor`.
  WorkPtr broadcast(torch::Tensor& tensor, int root = 0);
  // outputs[r] receives rank r's `input`; outputs must hold world_size() tensors shaped like input.
  WorkPtr all_gather(std::vector<torch::Tensor>& outputs, const torch::Tensor& input);
  // Into one tensor: `output` holds world_size() x input's elements, rank r's `input` in the r-th equal slice of
  // its elements (any shape, contiguous). What FSDP gathers a unit's flat parameters with.
  WorkPtr all_gather_into(torch::Tensor& output, const torch::Tensor& input);
  // `input` is world_size() equal chunks along dim 0; rank r receives op over all ranks' chunk r in `output`.
  WorkPtr reduce_scatter(torch::Tensor& output, const torch::Tensor& input, ReduceOp op = ReduceOp::Sum);
  WorkPtr barrier();

  // In-job recovery (comm/membership.h) makes each of a membership's communicators this way. A failed collective
  // then throws CommError at once with the backend's account, instead of first asking the other ranks through
  // the store which of them were lost (up to CollectiveTracker::kAnswerWait): the launcher knows who was lost,
  // and a second counts. And its waits can be abandoned (below).
  void serve_membership();
  // From any thread, on a communicator that serves a membership: every wait for one of its collectives, now or
  // later, throws CommError at once instead of waiting on. In-job recovery abandons a membership's communicator
  // when a member is lost, so that a rank whose collective waits on a peer of the lost one (which stopped
  // answering) does not wait for the timeout. The backend's own threads may stay in the collective: the
  // communicator is not used again.
  void abandon_waits();

  // The state abandon_waits() sets, shared with the works that wait (communicator.cpp).
  struct Abandonment;

 protected:
  // What a backend can do itself; the base emulates the rest.
  struct Capabilities {
    // ReduceOp::Avg. Without it an average is a sum of inputs divided by the world size (floating point and
    // complex: divided first, so that a sum of large values stays in range), or a sum divided afterwards,
    // truncating (integers).
    bool average = false;
    // A native reduce-scatter. Without it the base all-reduces a copy of the input and keeps this rank's chunk:
    // one more copy of the input, and in a ring each rank sends about twice the bytes of a reduce-scatter
    // (2 (N-1)/N of the input against (N-1)/N).
    bool reduce_scatter = false;
    // The one kind of device whose tensors the backend takes (CUDA for nccl, the CPU for mpi); empty: the
    // backend sorts out devices itself. Other tensors are refused by name before the backend sees them.
    std::optional<torch::DeviceType> tensor_device;
    // A native all-gather into one tensor. Without it the base hands the list all-gather views of the output's
    // slices: no copy in the base, but a backend that gathers into a buffer of its own (c10d's Gloo) copies
    // every gathered byte once more into the views.
    bool all_gather_into = false;
  };

  // `store` is the rendezvous store of all ranks, in which the collective tracker publishes this rank's
  // progress (docs/communicator.md).
  Communicator(std::string backend_name, StorePtr store, int rank, int world_size, std::chrono::milliseconds timeout,
               Capabilities capabilities, torch::Device device = torch::kCPU);

  // The backend's collectives, called with checked arguments, on tensors of the device the backend takes;
  // complex tensors arrive as views of (real, imaginary) pairs. Each starts its operation and returns at once.
  //
  // Failures: a tandem::Error thrown by a start_* call itself reaches the caller as it is (the backend has said
  // what is wrong: a dtype it lacks, a communicator broken earlier). Any other exception from start_*, and any
  // failure of the returned Work's wait() except UnsupportedError and InvalidArgument, is a failed collective:
  // the base hands it to the tracker, which names the ranks that were lost or never arrived, and a message
  // that says "timed out" becomes a TimeoutError.
  //
  // `op` is Avg only where capabilities.average.
  virtual WorkPtr start_all_reduce(torch::Tensor& tensor, ReduceOp op) = 0;
  virtual WorkPtr start_broadcast(torch::Tensor& tensor, int root) = 0;
  // `outputs` hold world_size() tensors with input's element count and dtype.
  virtual WorkPtr start_all_gather(std::vector<torch::Tensor>& outputs, const torch::Tensor& input) = 0;
  // Called only where capabilities.all_gather_into; `output` is contiguous with world_size() x input's elements,
  // same dtype.
  virtual WorkPtr start_all_gather_into(torch::Tensor& output, const torch::Tensor& input);
  // Called only where capabilities.reduce_scatter; `input` holds world_size() x output's elements, same dtype.
  virtual WorkPtr start_reduce_scatter(torch::Tensor& output, const torch::Tensor& input, ReduceOp op);
  virtual WorkPtr start_barrier() = 0;

  // For a backend whose set-up fails after the base was made: reported like a failed collective, naming
  // the ranks that never arrived. Never returns.
  [[noreturn]] void report_connect_failure(const std::string& backend_message);

 private:
  // Numbers the collective (and under TANDEM_DISTRIBUTED_DEBUG=DETAIL compares its signature across the ranks),
  // starts it and wraps the backend's work so that its failures are reported and
  // `on_complete` (the end of an emulation: a division, a chunk copied out) runs once it completed.
  WorkPtr issue(CollectiveSignature signature, const std::function<WorkPtr()>& start,
                std::function<void()> on_complete = nullptr);
  // Refuses a tensor on a device the backend does not take.
  void check_device(const torch::Tensor& tensor, const std::string& operation) const;

  std::string backend_name_;
  int rank_;
  int world_size_;
  std::chrono::milliseconds timeout_;
  Capabilities capabilities_;
  torch::Device device_;
  // TANDEM_DISTRIBUTED_DEBUG=DETAIL, read once at construction.
  bool compare_before_every_collective_;
  bool diagnose_failures_ = true;
  std::shared_ptr<Abandonment> abandonment_;  // null unless it serves a membership
  std::shared_ptr<CollectiveTracker> tracker_;
};
using CommunicatorPtr = std::shared_ptr<Communicator>;

}  // namespace tandem::comm
