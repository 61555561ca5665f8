#pragma once
// The nccl backend: LibTorch's c10d ProcessGroupNCCL, for CUDA tensors, one GPU per rank. Built only against a
// LibTorch with CUDA (TANDEM_HAVE_NCCL).
//
// Streams: c10d runs each collective on an NCCL stream of its own after making that stream wait (through a
// CUDA event) for the work already queued on the caller's current stream, which is where the tensor was
// produced. wait() makes the caller's current stream wait for the collective's end event, so the kernels that
// consume the result (the optimizer step) are ordered after it without a host synchronisation.
#include "tandem/comm/c10d/c10d_communicator.h"
#include "tandem/comm/rank_layout.h"

namespace tandem::comm {

class NcclCommunicator : public C10dCommunicator {
 public:
  // `device` is this rank's GPU (a CPU device: the GPU nccl_device_index() picks); it becomes the current CUDA
  // device. Throws InvalidArgument when no GPU is visible or this node's ranks would share GPUs (NCCL cannot put
  // two ranks on one GPU); under SLURM, one visible GPU per task is each rank's own (nccl_device.h).
  NcclCommunicator(StorePtr store, const RankLayout& layout, std::chrono::milliseconds timeout, torch::Device device);
};

}  // namespace tandem::comm
