#pragma once
// Which device a rank computes on. InitOptions::device takes "cpu", "cuda" or "auto"; a CUDA rank uses GPU
// LOCAL_RANK (modulo the visible GPUs, so that ranks may share one GPU over gloo; nccl refuses that, see
// comm/nccl/nccl_device.h). Everything that depends on whether this build has CUDA sits behind
// TANDEM_HAVE_CUDA in device.cpp, so callers never test the build themselves.
#include <torch/types.h>

#include <string>

namespace tandem {

// This tandem was built against a LibTorch with CUDA.
bool cuda_built();
// GPUs this process can see (CUDA_VISIBLE_DEVICES applies); 0 in a CPU-only build.
int visible_gpu_count();

// Resolves `spec` for the rank with this local rank. "auto" is cuda where a GPU is visible, else cpu.
// Throws InvalidArgument with one line naming what is missing for "cuda" on a CPU-only build or on a machine
// with no visible GPU, and for anything other than the three names.
torch::Device select_device(const std::string& spec, int local_rank);

// Makes `device` the current CUDA device of the calling thread (a no-op for the CPU), so that NCCL, the
// caching allocator and new streams pick the rank's own GPU.
void make_current(const torch::Device& device);

// Waits on the host until every kernel queued on `device` has finished (a no-op for the CPU): for timing only,
// never on a training path.
void synchronize(const torch::Device& device);

}  // namespace tandem
