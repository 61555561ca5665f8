// Which GPU a rank of the nccl backend drives, and when it refuses: every visible GPU shared by a node's ranks
// (tandem run), one GPU per task (srun --gpus-per-task=1), and the layouts NCCL cannot run. A pure decision, so
// it runs without a GPU and in builds without NCCL.
#include <gtest/gtest.h>

#include "tandem/comm/nccl/nccl_device.h"
#include "tandem/util/error.h"

namespace tandem::comm::nccl_device_test {

NcclPlacement placement(int local_rank, int local_world_size, int visible_gpus, bool scheduler_may_split_gpus) {
  NcclPlacement result;
  result.local_rank = local_rank;
  result.local_world_size = local_world_size;
  result.visible_gpus = visible_gpus;
  result.scheduler_may_split_gpus = scheduler_may_split_gpus;
  return result;
}

std::string refusal(const NcclPlacement& given) {
  try {
    const int index = nccl_device_index(given);
    return "no refusal, device " + std::to_string(index);
  } catch (const InvalidArgument& error) {
    return error.what();
  }
}

TEST(NcclDevice, EveryGpuVisibleGivesEachRankGpuLocalRank) {
  for (bool scheduler : {false, true}) {
    for (int local_rank = 0; local_rank < 4; ++local_rank) {
      EXPECT_EQ(nccl_device_index(placement(local_rank, 4, 4, scheduler)), local_rank) << "scheduler " << scheduler;
      EXPECT_EQ(nccl_device_index(placement(local_rank, 4, 8, scheduler)), local_rank) << "scheduler " << scheduler;
    }
  }
}

TEST(NcclDevice, OneGpuPerSlurmTaskIsDeviceZeroForEveryRank) {
  // srun -n4 --gpus-per-task=1: each task sees only its own GPU, as device 0.
  for (int local_rank = 0; local_rank < 4; ++local_rank) {
    EXPECT_EQ(nccl_device_index(placement(local_rank, 4, 1, true)), 0) << "local rank " << local_rank;
  }
  // --gpus-per-task=2: each rank drives the first of its own two.
  EXPECT_EQ(nccl_device_index(placement(3, 4, 2, true)), 0);
}

TEST(NcclDevice, RanksOfALauncherThatWouldShareAGpuAreRefused) {
  // tandem run --nproc-per-node 2 on a machine with one GPU: both workers see it, and NCCL cannot run them.
  const std::string message = refusal(placement(1, 2, 1, false));
  EXPECT_EQ(message,
            "backend nccl: 2 ranks on this node but only 1 visible GPU(s), and NCCL runs one rank per GPU; start at "
            "most 1 per node, or use `backend` gloo to share GPUs");
}

TEST(NcclDevice, NoVisibleGpuIsRefusedWhoeverMadeTheLayout) {
  for (bool scheduler : {false, true}) {
    EXPECT_EQ(refusal(placement(0, 1, 0, scheduler)),
              "backend nccl needs a CUDA GPU, and none is visible; use `backend` gloo")
        << "scheduler " << scheduler;
  }
}

}  // namespace tandem::comm::nccl_device_test
