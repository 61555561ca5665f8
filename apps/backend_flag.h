#pragma once
// The help of every command's --backend: which backend runs without the flag (comm::default_backend()) in this
// build, so that a CPU build never promises nccl.
#include <fmt/format.h>

#include <algorithm>
#include <string>

#include "tandem/comm/backend.h"

namespace tandem::app {

// `gpu_word` says what must be on a GPU for nccl ("the buffer lives", "--device resolves").
inline std::string backend_flag_help(const char* gpu_word) {
  const auto backends = comm::available_backends();
  const bool has_nccl = std::find(backends.begin(), backends.end(), "nccl") != backends.end();
  return fmt::format("Communication backend, of those this build has (default: {})",
                     has_nccl ? fmt::format("nccl where {} on a GPU, else gloo", gpu_word)
                              : std::string("gloo; nccl needs a build against a LibTorch with CUDA"));
}

}  // namespace tandem::app
