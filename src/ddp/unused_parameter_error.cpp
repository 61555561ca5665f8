#include "unused_parameter_error.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "tandem/util/error.h"

namespace tandem::ddp {

void throw_unused_parameters(int rank, const std::vector<std::string>& missing, const std::vector<int>& ranks_missing) {
  const std::string advice =
      "if the model does not use every parameter in each iteration, construct DistributedDataParallel with "
      "DdpOptions::find_unused_parameters = true";
  if (!missing.empty()) {
    throw InvalidArgument(fmt::format(
        "DistributedDataParallel: parameters got no gradient in this backward on rank {} ({}); ranks with such "
        "parameters: [{}]; {}",
        rank, fmt::join(missing, ", "), fmt::join(ranks_missing, ", "), advice));
  }
  throw InvalidArgument(fmt::format(
      "DistributedDataParallel: ranks [{}] had parameters that got no gradient in this backward (their error names "
      "them); {}",
      fmt::join(ranks_missing, ", "), advice));
}

}  // namespace tandem::ddp
