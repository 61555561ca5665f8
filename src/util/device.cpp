#include "tandem/util/device.h"

#include <fmt/format.h>
#include <torch/cuda.h>

#include <cstdlib>

#include "tandem/config.h"
#include "tandem/util/error.h"
#if TANDEM_HAVE_CUDA
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#endif

namespace tandem {

bool cuda_built() { return TANDEM_HAVE_CUDA != 0; }

int visible_gpu_count() { return cuda_built() ? static_cast<int>(torch::cuda::device_count()) : 0; }

torch::Device select_device(const std::string& spec, int local_rank) {
  if (spec == "cpu") return torch::kCPU;
  if (spec != "cuda" && spec != "auto") {
    throw InvalidArgument(fmt::format("`device` '{}' is not a device; use cpu, cuda or auto", spec));
  }
  const int gpus = visible_gpu_count();
  if (spec == "auto" && gpus == 0) return torch::kCPU;
  if (!cuda_built()) {
    throw InvalidArgument(
        "`device` cuda: this tandem was built against a CPU-only LibTorch; rebuild against a LibTorch with CUDA "
        "(scripts/build --libtorch pypi) or use `device` cpu");
  }
  if (gpus == 0) {
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    throw InvalidArgument(fmt::format("`device` cuda: no CUDA GPU is visible on this machine{}; use `device` cpu",
                                      visible ? fmt::format(" (CUDA_VISIBLE_DEVICES='{}')", visible) : ""));
  }
  return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(local_rank % gpus));
}

void make_current(const torch::Device& device) {
#if TANDEM_HAVE_CUDA
  if (device.is_cuda()) c10::cuda::set_device(device.index());
#else
  TANDEM_CHECK(!device.is_cuda(), "a CUDA device in a build without CUDA");
#endif
}

void synchronize(const torch::Device& device) {
#if TANDEM_HAVE_CUDA
  if (device.is_cuda()) {
    c10::cuda::CUDAGuard guard(device);
    c10::cuda::device_synchronize();
  }
#endif
}

}  // namespace tandem
