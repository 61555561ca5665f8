#pragma once
// The part of the gloo and nccl backends that is the same: both wrap one of LibTorch's c10d process groups.
// This class hands the base's collectives to the group and words c10d's refusals of a dtype as tandem's.
#include <optional>

#include "tandem/comm/communicator.h"
#include "tandem/util/compat.h"

namespace tandem::comm {

class C10dCommunicator : public Communicator {
 public:
  ~C10dCommunicator() override;

 protected:
  // How a collective's wait() learns that it has completed.
  enum class Completion {
    // c10d's wait() returns once it has, or throws at c10d's own timeout (gloo).
    kBackendWaits,
    // c10d's wait() only orders streams (nccl): the host first polls the work until the collective's deadline
    // (comm/work_deadline.h), so that a collective a peer never joins ends in a TimeoutError.
    kPollUntilDeadline,
  };

  C10dCommunicator(std::string backend_name, StorePtr store, int rank, int world_size,
                   std::chrono::milliseconds timeout, Capabilities capabilities, torch::Device device = torch::kCPU,
                   Completion completion = Completion::kBackendWaits);
  // Connects the backend; the derived constructor passes a function that creates its c10d group, so that a
  // failure to connect is reported like any collective's.
  void connect(const std::function<c10::intrusive_ptr<compat::C10dBackend>()>& create);

  WorkPtr start_all_reduce(torch::Tensor& tensor, ReduceOp op) override;
  WorkPtr start_broadcast(torch::Tensor& tensor, int root) override;
  WorkPtr start_all_gather(std::vector<torch::Tensor>& outputs, const torch::Tensor& input) override;
  WorkPtr start_all_gather_into(torch::Tensor& output, const torch::Tensor& input) override;
  WorkPtr start_reduce_scatter(torch::Tensor& output, const torch::Tensor& input, ReduceOp op) override;
  WorkPtr start_barrier() override;

 private:
  // Starts a c10d collective and wraps its work; `tensor` is the data it carries, for messages about
  // unsupported dtypes.
  WorkPtr wrap(const std::string& operation, const torch::Tensor& tensor,
               const std::function<c10::intrusive_ptr<c10d::Work>()>& start);

  c10::intrusive_ptr<compat::C10dBackend> group_;
  Completion completion_;
};

}  // namespace tandem::comm
