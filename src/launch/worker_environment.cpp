#include "tandem/launch/worker_environment.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sched.h>

#include <algorithm>

#include "tandem/comm/membership.h"

namespace tandem::launch {

int usable_cpu_count() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(CPU_COUNT(&set), 1);
  return 1;
}

std::map<std::string, std::string> worker_environment(const LaunchPlan& plan, int local_rank, int restart_count,
                                                      const comm::EnvLookup& parent, int cpu_count) {
  std::map<std::string, std::string> env{
      {"RANK", std::to_string(plan.global_rank(local_rank))},
      {"LOCAL_RANK", std::to_string(local_rank)},
      {"WORLD_SIZE", std::to_string(plan.world_size())},
      {"LOCAL_WORLD_SIZE", std::to_string(plan.nproc_per_node)},
      {"GROUP_RANK", std::to_string(plan.node_rank)},
      {"MASTER_ADDR", plan.master_addr},
      {"MASTER_PORT", std::to_string(plan.master_port)},
      // torchrun's names: a worker that resumes work of its own can tell a restart from a first start.
      {"TORCHELASTIC_RESTART_COUNT", std::to_string(restart_count)},
      {"TORCHELASTIC_MAX_RESTARTS", std::to_string(plan.max_restarts)},
      // Every attempt of the job shares it, so a restarted worker finds the run the first attempt began.
      {"TORCHELASTIC_RUN_ID", plan.run_id},
  };
  if (plan.recovery == Recovery::kInJob) env[comm::kRecoveryVariable] = comm::kInJobRecovery;
  // N workers each running cpu_count OpenMP threads would oversubscribe the node N times over; a value the
  // user exported is a deliberate choice and is kept.
  if (!parent("OMP_NUM_THREADS")) {
    env["OMP_NUM_THREADS"] = std::to_string(std::max(cpu_count / plan.nproc_per_node, 1));
  }
  // Every worker sees the same listed GPUs and picks cuda:LOCAL_RANK among them, as under torchrun.
  if (!plan.gpus.empty()) env["CUDA_VISIBLE_DEVICES"] = fmt::format("{}", fmt::join(plan.gpus, ","));
  return env;
}

}  // namespace tandem::launch
