#pragma once
// Making the replicas on all ranks agree: first that they are the same model (so no collective can hang on
// mismatched sizes), then that they hold the same values.
#include <torch/nn/module.h>
#include <torch/types.h>

#include <string>
#include <vector>

#include "tandem/comm/communicator.h"

namespace tandem::ddp {

// Collective: every rank must call it. Compares the ranks' descriptions (name, shape, dtype, requires_grad of
// every parameter and buffer, plus `settings`, e.g. the DDP options) with one small all_gather; if any rank
// differs, every rank throws the same InvalidArgument naming the first differing entry and the ranks.
void verify_replicas_match(comm::Communicator& communicator, const torch::OrderedDict<std::string, torch::Tensor>& parameters,
                           const torch::OrderedDict<std::string, torch::Tensor>& buffers, const std::string& settings);

// Collective. Compares a fingerprint of each tensor's bytes across the ranks with one all-gather of a few bytes
// per tensor; if any rank differs, every rank throws the same ReplicaDivergenceError naming the first tensor
// that differs, the ranks on each side and `when` (e.g. "at synchronised forward 300"). A rank that no longer
// trains (it ran out of data and shadows the others, see ddp/join.h) takes part without `participating`: its
// replica is left out of the comparison.
void verify_replicas_hold_same_values(comm::Communicator& communicator,
                                      const torch::OrderedDict<std::string, torch::Tensor>& tensors,
                                      const std::string& when, bool participating = true);

// Copies root's values of a fixed list of tensors to every rank with one broadcast per (dtype, device), through
// flat staging buffers that are allocated once and reused (buffers are re-broadcast at every forward).
class CoalescedBroadcaster {
 public:
  explicit CoalescedBroadcaster(std::vector<torch::Tensor> tensors);
  // Collective. Writes into the tensors in place (under NoGradGuard, so parameters may be among them).
  void broadcast(comm::Communicator& communicator, int root = 0);
  bool empty() const { return groups_.empty(); }

 private:
  struct Group {
    std::vector<torch::Tensor> tensors;
    torch::Tensor flat;
  };
  std::vector<Group> groups_;
};

}  // namespace tandem::ddp
