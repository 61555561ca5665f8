#include "tandem/comm/communicator.h"

namespace tandem::comm {

std::string to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return "sum";
    case ReduceOp::Avg:
      return "avg";
    case ReduceOp::Min:
      return "min";
    case ReduceOp::Max:
      return "max";
  }
  return "unknown";
}

}  // namespace tandem::comm
