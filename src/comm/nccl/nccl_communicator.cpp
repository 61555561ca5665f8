#include "tandem/comm/nccl/nccl_communicator.h"

#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include "tandem/comm/collective_tracker.h"
#include "tandem/comm/nccl/nccl_device.h"
#include "tandem/util/device.h"
#include "tandem/util/error.h"

namespace tandem::comm {
namespace {

// c10d's own timeout, past ours: its watchdog aborts the process at that point, so it is left only for a
// collective nobody waits on. A collective that is waited on times out first, on the host (work_deadline.h),
// and the tracker then has time to find out why before the TimeoutError is thrown.
constexpr std::chrono::milliseconds kWatchdogGrace = 2 * CollectiveTracker::kDiagnosisDeadline;

// Checked before any NCCL call, so that the user reads why instead of NCCL's "duplicate GPU detected"
// (nccl_device.h). A CUDA device the caller chose is kept; the check still refuses a node with too few GPUs.
torch::Device checked_device(const RankLayout& layout, torch::Device device) {
  NcclPlacement placement;
  placement.local_rank = layout.local_rank;
  placement.local_world_size = layout.local_world_size;
  placement.visible_gpus = visible_gpu_count();
  placement.scheduler_may_split_gpus = layout.source == "slurm";
  const int index = nccl_device_index(placement);
  if (!device.is_cuda()) device = torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(index));
  return device;
}

}  // namespace

NcclCommunicator::NcclCommunicator(StorePtr store, const RankLayout& layout, std::chrono::milliseconds timeout,
                                   torch::Device device)
    : C10dCommunicator("nccl", store, layout.rank, layout.world_size, timeout,
                       Capabilities{/*average=*/true, /*reduce_scatter=*/true, /*tensor_device=*/torch::kCUDA,
                                    /*all_gather_into=*/true},
                       checked_device(layout, device), Completion::kPollUntilDeadline) {
  make_current(this->device());
  connect([&] {
    auto options = c10d::ProcessGroupNCCL::Options::create();
    options->timeout = timeout + kWatchdogGrace;
    return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, layout.rank, layout.world_size, options);
  });
}

}  // namespace tandem::comm
