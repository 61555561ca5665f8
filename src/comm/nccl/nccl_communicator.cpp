#include "tandem/comm/nccl/nccl_communicator.h"

#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#include <torch/cuda.h>

#include "tandem/util/error.h"

namespace tandem::comm {

NcclCommunicator::NcclCommunicator(StorePtr store, const RankLayout& layout, std::chrono::milliseconds timeout)
    : C10dCommunicator("nccl", store, layout.rank, layout.world_size, timeout) {
  int visible = static_cast<int>(torch::cuda::device_count());
  if (visible == 0) throw InvalidArgument("backend nccl needs a CUDA GPU, and none is visible; use --backend gloo");
  if (layout.local_world_size > visible) {
    throw InvalidArgument(fmt::format("{} ranks per node but only {} visible GPU(s); start at most {} per node or use "
                                      "--backend gloo",
                                      layout.local_world_size, visible, visible));
  }
  connect(
      [&] {
        auto options = c10d::ProcessGroupNCCL::Options::create();
        options->timeout = timeout;
        return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, layout.rank, layout.world_size, options);
      },
      {/*average=*/true, /*reduce_scatter=*/true});
}

}  // namespace tandem::comm
