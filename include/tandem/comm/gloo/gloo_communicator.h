#pragma once
// The gloo backend: LibTorch's c10d ProcessGroupGloo (TCP between ranks, CPU tensors; CUDA tensors are staged
// through the host). Its collectives run on Gloo's own worker threads, so they progress while the caller
// computes.
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include "tandem/comm/collective_tracker.h"
#include "tandem/comm/communicator.h"

namespace tandem::comm {

struct GlooOptions {
  // Address to bind; ranks on one host use loopback, "" means the address this host's name resolves to.
  std::string hostname = "127.0.0.1";
  // Gloo worker threads: collectives in flight at once (DDP keeps one per bucket in flight).
  int threads = 2;
};

class GlooCommunicator : public Communicator {
 public:
  GlooCommunicator(StorePtr store, int rank, int world_size, std::chrono::milliseconds timeout,
                   const GlooOptions& options = {});

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  std::string backend_name() const override { return "gloo"; }
  std::chrono::milliseconds timeout() const override { return timeout_; }

  WorkPtr all_reduce(torch::Tensor& tensor, ReduceOp op) override;
  WorkPtr broadcast(torch::Tensor& tensor, int root) override;
  WorkPtr all_gather(std::vector<torch::Tensor>& outputs, const torch::Tensor& input) override;
  WorkPtr reduce_scatter(torch::Tensor& output, const torch::Tensor& input, ReduceOp op) override;
  WorkPtr barrier() override;

 private:
  int rank_;
  int world_size_;
  std::chrono::milliseconds timeout_;
  std::shared_ptr<CollectiveTracker> tracker_;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> group_;
};

}  // namespace tandem::comm
