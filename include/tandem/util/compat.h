#pragma once
// The one place where tandem bends to differences between LibTorch 1.13 (Debian, CPU) and LibTorch 2.x
// (CUDA builds). Everything else includes this instead of testing versions itself.
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/version.h>

#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
#endif

namespace tandem::compat {

// The c10d class that Gloo's and NCCL's process groups derive from and that declares the collectives:
// ProcessGroup in 1.13, Backend from 2.0 on.
#if TORCH_VERSION_MAJOR >= 2
using C10dBackend = c10d::Backend;
#else
using C10dBackend = c10d::ProcessGroup;
#endif

}  // namespace tandem::compat
