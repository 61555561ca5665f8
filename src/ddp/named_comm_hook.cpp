#include "tandem/ddp/named_comm_hook.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "tandem/comm/value_collectives.h"
#include "tandem/util/error.h"

namespace tandem::ddp {

const std::vector<std::string>& comm_hook_names() {
  static const std::vector<std::string> names{"average", "fp16", "bf16", "powersgd"};
  return names;
}

CommHookPtr make_comm_hook(const std::string& name, const PowerSgdOptions& powersgd) {
  if (name == "average") return make_average_hook();
  if (name == "fp16") return make_fp16_compress_hook();
  if (name == "bf16") return make_bf16_compress_hook();
  if (name == "powersgd") return make_powersgd_hook(powersgd);
  require_comm_hook_name(name);
  TANDEM_CHECK(false, "comm hook '", name, "' is listed but made by no branch");
}

void require_comm_hook_name(const std::string& name) {
  const auto& names = comm_hook_names();
  if (std::find(names.begin(), names.end(), name) != names.end()) return;
  throw InvalidArgument(fmt::format("comm hook '{}' is unknown; the hooks are {}", name, fmt::join(names, ", ")));
}

void require_backend_reduces(const std::string& name, comm::Communicator& communicator) {
  if (name != "fp16" && name != "bf16") return;
  torch::Tensor probe = torch::zeros({1}, name == "fp16" ? torch::kHalf : torch::kBFloat16);
  try {
    comm::all_reduce_values(communicator, probe, comm::ReduceOp::Sum);
  } catch (const UnsupportedError&) {
    throw InvalidArgument(fmt::format("`comm_hook` {} needs a backend that reduces {}, and {} in this build does not; "
                                      "use `comm_hook` {}, or a LibTorch 2.x build",
                                      name, name == "fp16" ? "float16" : "bfloat16", communicator.backend_name(),
                                      name == "fp16" ? "bf16" : "fp16"));
  }
}

}  // namespace tandem::ddp
