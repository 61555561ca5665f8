#pragma once
// The environment a worker of `tandem run` starts with: the launcher's own, plus the torchrun variables that
// tandem::init_process_group (and PyTorch) read. A pure function, so the layout can be tested without
// starting processes.
#include <map>
#include <string>

#include "tandem/comm/rank_layout.h"
#include "tandem/launch/launch_options.h"

namespace tandem::launch {

// The variables to set (overriding the launcher's) for the worker with this local rank in attempt
// `restart_count` (0 for the first start): RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK,
// MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_MAX_RESTARTS, TORCHELASTIC_RUN_ID; OMP_NUM_THREADS = cpu_count /
// nproc_per_node (at least 1) unless `parent` already sets it; CUDA_VISIBLE_DEVICES when plan.gpus is set.
std::map<std::string, std::string> worker_environment(const LaunchPlan& plan, int local_rank, int restart_count,
                                                      const comm::EnvLookup& parent, int cpu_count);

// CPUs this process may run on (its affinity mask), at least 1.
int usable_cpu_count();

}  // namespace tandem::launch
