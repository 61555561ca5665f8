#pragma once
// SLURM's compressed host lists and task counts, as found in SLURM_NODELIST and SLURM_TASKS_PER_NODE.
#include <string>
#include <vector>

namespace tandem::comm {

// "node[03-05,07],login1" -> {"node03", "node04", "node05", "node07", "login1"}. Zero padding is kept.
std::vector<std::string> expand_slurm_nodelist(const std::string& nodelist);

// "2(x3),1" -> {2, 2, 2, 1}: tasks on each node, in node order.
std::vector<int> expand_slurm_tasks_per_node(const std::string& tasks_per_node);

}  // namespace tandem::comm
