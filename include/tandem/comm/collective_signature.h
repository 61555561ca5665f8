#pragma once
// What a collective is, as the ranks compare it by sequence number (docs/communicator.md): its kind and, where it
// carries a tensor, the tensor's dtype and element count. Two ranks whose collective number n has different
// signatures disagree on the collectives, whatever the transport would make of it.
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <optional>
#include <string>

namespace tandem::comm {

struct CollectiveSignature {
  // "all_reduce(avg)", "broadcast(root 1)", "barrier".
  std::string kind;
  // Empty for a collective without data (barrier).
  std::optional<c10::ScalarType> dtype;
  int64_t numel = 0;

  // "all_reduce(avg) float32[60]", or "barrier".
  std::string describe() const;
};

}  // namespace tandem::comm
