#include "support/gpu.h"

#include <algorithm>
#include <vector>

#include "tandem/comm/backend.h"

namespace tandem::testing {

std::string gpu_test_backend(int world_size) {
  const std::vector<std::string> backends = comm::available_backends();
  const bool have_nccl = std::find(backends.begin(), backends.end(), "nccl") != backends.end();
  return have_nccl && visible_gpu_count() >= world_size ? "nccl" : "gloo";
}

}  // namespace tandem::testing
