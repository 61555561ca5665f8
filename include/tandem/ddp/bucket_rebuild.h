#pragma once
// Buckets formed in reverse registration order launch late when backward produces gradients in another order
// (a layer registered early but used last, a shared head): their first gradient waits for their last. So the
// first synchronised backward records the order in which gradients became ready, and the next synchronised
// forward (or shadow iteration) rebuilds the buckets once, in rank 0's order: every rank adopts the same one, so
// the collectives stay matched. With static_graph the parameters no rank used in the first iteration leave the
// buckets then.
//
// Part of the Reducer (reducer.h), which calls it with its mutex held.
#include <cstddef>
#include <vector>

#include "tandem/comm/communicator.h"

namespace tandem::ddp {

class BucketRebuild {
 public:
  void reserve(size_t param_count) { ready_order_.reserve(param_count); }

  // Whether backward's ready order is recorded: until a rebuild is due.
  bool recording() const { return !rebuilt_ && !due_; }
  void record_ready(size_t param_index) {
    if (recording()) ready_order_.push_back(param_index);
  }
  // At the start of a synchronised backward: one that failed before its end left a partial order behind.
  void discard_partial_order() {
    if (recording()) ready_order_.clear();
  }

  // After the tail's agreement: the first iteration that some rank trained in makes the rebuild due, on every
  // rank alike. `globally_used` is the tail's (empty outside the unused-parameter search).
  void decide(int trained_ranks, const std::vector<char>& globally_used, bool find_unused_parameters,
              bool static_graph);
  bool due() const { return due_; }

  // Collective: rank 0's ready order, the parameters that got no gradient in that backward after the others in
  // reverse registration order, without those static_graph leaves out. The walk order for assign_buckets.
  std::vector<size_t> agreed_order(comm::Communicator& communicator, size_t param_count, bool static_graph) const;
  // Once the buckets are rebuilt: nothing more is recorded or rebuilt.
  void complete();

 private:
  std::vector<size_t> ready_order_;
  bool due_ = false;
  bool rebuilt_ = false;
  std::vector<char> used_in_first_iteration_;
};

}  // namespace tandem::ddp
