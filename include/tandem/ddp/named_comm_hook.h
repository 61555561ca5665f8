#pragma once
// A comm hook chosen by its name on a command line (`tandem train --comm-hook`, `tandem bench train
// --comm-hook`): average, fp16, bf16 or powersgd, as PyTorch's default_hooks and powerSGD_hook.
#include <string>
#include <vector>

#include "tandem/comm/communicator.h"
#include "tandem/ddp/comm_hook.h"
#include "tandem/ddp/powersgd_hook.h"

namespace tandem::ddp {

// The names make_comm_hook knows, in the order --help lists them.
const std::vector<std::string>& comm_hook_names();

// Throws InvalidArgument naming the hooks unless `name` is one of them: for options checked before any hook is made.
void require_comm_hook_name(const std::string& name);

// A new hook (hooks keep per-DDP state, so each DistributedDataParallel needs its own); `powersgd` configures
// "powersgd" only. Throws InvalidArgument naming the hooks for an unknown name.
CommHookPtr make_comm_hook(const std::string& name, const PowerSgdOptions& powersgd = {});

// Collective: the hook `name` sends 16-bit floats, which some backends cannot reduce (Gloo in LibTorch 1.13 has
// no bfloat16). A one-element all-reduce of that dtype finds out, on every rank alike, before training rather
// than at the first backward; throws InvalidArgument saying what to use instead.
void require_backend_reduces(const std::string& name, comm::Communicator& communicator);

}  // namespace tandem::ddp
