#pragma once
// The GPU test tier. GPU tests are named *OnGpu* (scripts/gpu-check runs `ctest -R OnGpu`) and skip, saying
// why, on a machine without a GPU or in a build without CUDA, so the CPU machines' suite stays green.
#include <gtest/gtest.h>

#include <string>

#include "tandem/util/device.h"

#define TANDEM_SKIP_WITHOUT_GPU()                                                                  \
  do {                                                                                            \
    if (::tandem::visible_gpu_count() == 0) {                                                     \
      GTEST_SKIP() << (::tandem::cuda_built() ? "no CUDA GPU is visible" : "this build has no CUDA"); \
    }                                                                                             \
  } while (false)

namespace tandem::testing {

// The backend for world_size ranks on GPUs here: nccl with one GPU per rank where there are enough GPUs, else
// gloo with CUDA tensors, all ranks sharing GPU 0 (NCCL refuses two ranks on one GPU).
std::string gpu_test_backend(int world_size);

}  // namespace tandem::testing
