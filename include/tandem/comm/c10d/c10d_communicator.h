#pragma once
// The part of the gloo and nccl backends that is the same: both wrap one of LibTorch's c10d process groups.
// This class issues the collectives, fills in what a backend lacks (average, reduce-scatter) and turns
// failures into tandem errors that name the collective and the ranks that never reached it.
#include "tandem/comm/collective_tracker.h"
#include "tandem/comm/communicator.h"
#include "tandem/util/compat.h"

namespace tandem::comm {

class C10dCommunicator : public Communicator {
 public:
  ~C10dCommunicator() override;

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  std::string backend_name() const override { return backend_name_; }
  std::chrono::milliseconds timeout() const override { return timeout_; }
  torch::Device device() const override { return device_; }

  WorkPtr all_reduce(torch::Tensor& tensor, ReduceOp op) override;
  WorkPtr broadcast(torch::Tensor& tensor, int root) override;
  WorkPtr all_gather(std::vector<torch::Tensor>& outputs, const torch::Tensor& input) override;
  WorkPtr reduce_scatter(torch::Tensor& output, const torch::Tensor& input, ReduceOp op) override;
  WorkPtr barrier() override;

 protected:
  // What the wrapped group can do natively; the rest is emulated with all-reduce.
  struct Capabilities {
    bool average = false;
    bool reduce_scatter = false;
    // The group takes CUDA tensors only (nccl); a CPU tensor is refused by name before c10d sees it.
    bool cuda_tensors_only = false;
  };

  C10dCommunicator(std::string backend_name, StorePtr store, int rank, int world_size,
                   std::chrono::milliseconds timeout, torch::Device device = torch::kCPU);
  // Connects the backend; the derived constructor passes a function that creates its c10d group, so that a
  // failure to connect is reported like any collective's.
  void connect(const std::function<c10::intrusive_ptr<compat::C10dBackend>()>& create, Capabilities capabilities);

 private:
  // Numbers the collective, starts it, and wraps the c10d work; failures at either point become tandem errors.
  // `tensor` is the data the collective carries, for messages about unsupported dtypes.
  WorkPtr issue(const std::string& operation, const torch::Tensor& tensor,
                const std::function<c10::intrusive_ptr<c10d::Work>()>& start, std::function<void()> on_complete);

  std::string backend_name_;
  int rank_;
  int world_size_;
  std::chrono::milliseconds timeout_;
  torch::Device device_;
  std::shared_ptr<CollectiveTracker> tracker_;
  c10::intrusive_ptr<compat::C10dBackend> group_;
  Capabilities capabilities_;
};

}  // namespace tandem::comm
