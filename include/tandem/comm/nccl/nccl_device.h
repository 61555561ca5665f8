#pragma once
// Which GPU a rank of the nccl backend drives, decided before any NCCL call so that a layout NCCL cannot run is
// refused with its reason instead of NCCL's "duplicate GPU detected". Inline, without CUDA or NCCL, so that a
// build without NCCL (which leaves src/comm/nccl/ out) tests the decision too.
//
// NCCL runs one rank per GPU. Two layouts give each rank of a node a GPU of its own:
//  - every rank sees all of the node's GPUs (`tandem run`, torchrun, or srun with the node's GPUs shared by its
//    tasks): rank LOCAL_RANK drives GPU LOCAL_RANK, so the node needs at least as many visible GPUs as ranks;
//  - the scheduler gives each task GPUs of its own and hides the others (srun --gpus-per-task=1 sets
//    CUDA_VISIBLE_DEVICES per task): each rank drives the first GPU it sees, device 0, whatever its LOCAL_RANK.
// From inside one process the second layout looks like ranks crowding onto too few GPUs. It is therefore
// assumed only where a scheduler made the layout (SLURM); the launchers give every worker the same
// CUDA_VISIBLE_DEVICES, so under them fewer visible GPUs than ranks on the node is refused. Tasks that SLURM
// lets share one GPU pass this check and meet NCCL's own refusal at its first call.
#include <fmt/format.h>

#include "tandem/util/error.h"

namespace tandem::comm {

struct NcclPlacement {
  int local_rank = 0;
  int local_world_size = 1;  // ranks on this node
  int visible_gpus = 0;      // GPUs this process sees (CUDA_VISIBLE_DEVICES applied)
  // The layout came from a scheduler that may give each task GPUs of its own (SLURM), not from a launcher that
  // shows every worker the same GPUs.
  bool scheduler_may_split_gpus = false;
};

// The index, among this process's visible GPUs, of the one its rank drives. Throws InvalidArgument, saying why,
// when no GPU is visible or the node's ranks would have to share GPUs.
inline int nccl_device_index(const NcclPlacement& placement) {
  if (placement.visible_gpus == 0) {
    throw InvalidArgument("backend nccl needs a CUDA GPU, and none is visible; use `backend` gloo");
  }
  if (placement.visible_gpus >= placement.local_world_size) return placement.local_rank;
  if (placement.scheduler_may_split_gpus) return 0;
  throw InvalidArgument(fmt::format("backend nccl: {} ranks on this node but only {} visible GPU(s), and NCCL runs "
                                    "one rank per GPU; start at most {} per node, or use `backend` gloo to share "
                                    "GPUs",
                                    placement.local_world_size, placement.visible_gpus, placement.visible_gpus));
}

}  // namespace tandem::comm
