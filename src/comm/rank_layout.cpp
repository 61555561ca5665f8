#include "tandem/comm/rank_layout.h"

#include <fmt/format.h>

#include <cstdlib>

#include "tandem/comm/slurm_nodelist.h"
#include "tandem/util/error.h"

namespace tandem::comm {
namespace {

int parse_int(const std::string& name, const std::string& value) {
  // std::stoi alone would accept " 2" and "+2"; a scheduler never writes those, a typo in a script does.
  const size_t first_digit = !value.empty() && value[0] == '-' ? 1 : 0;
  const bool digits_only = value.size() > first_digit &&
                           value.find_first_not_of("0123456789", first_digit) == std::string::npos;
  try {
    size_t used = 0;
    int parsed = digits_only ? std::stoi(value, &used) : 0;
    if (digits_only && used == value.size()) return parsed;
  } catch (const std::exception&) {
  }
  throw InvalidArgument(fmt::format("environment variable {}='{}' is not an integer", name, value));
}

std::optional<int> env_int(const EnvLookup& env, const std::string& name) {
  if (auto value = env(name)) return parse_int(name, *value);
  return std::nullopt;
}

void read_torchrun(RankLayout& layout, const EnvLookup& env) {
  layout.source = "env";
  layout.rank = *env_int(env, "RANK");
  layout.world_size = env_int(env, "WORLD_SIZE").value_or(1);
  layout.local_rank = env_int(env, "LOCAL_RANK").value_or(layout.rank);
  layout.local_world_size = env_int(env, "LOCAL_WORLD_SIZE").value_or(layout.world_size);
  layout.node_rank = env_int(env, "GROUP_RANK").value_or(layout.rank / std::max(layout.local_world_size, 1));
  layout.master_addr = env("MASTER_ADDR").value_or(layout.master_addr);
  layout.master_port = env_int(env, "MASTER_PORT").value_or(layout.master_port);
  // torchrun writes Python's str(True).
  layout.launcher_serves_store = env("TORCHELASTIC_USE_AGENT_STORE").value_or("") == "True";
  layout.restart_count = env_int(env, "TORCHELASTIC_RESTART_COUNT").value_or(0);
  layout.store_file = env("TANDEM_STORE_FILE").value_or("");
}

void read_slurm(RankLayout& layout, const EnvLookup& env) {
  layout.source = "slurm";
  layout.rank = *env_int(env, "SLURM_PROCID");
  layout.world_size = env_int(env, "SLURM_NTASKS").value_or(1);
  layout.local_rank = env_int(env, "SLURM_LOCALID").value_or(0);
  layout.node_rank = env_int(env, "SLURM_NODEID").value_or(0);
  if (auto per_node = env_int(env, "SLURM_NTASKS_PER_NODE")) {
    layout.local_world_size = *per_node;
  } else if (auto tasks = env("SLURM_TASKS_PER_NODE")) {
    std::vector<int> counts = expand_slurm_tasks_per_node(*tasks);
    size_t node = static_cast<size_t>(layout.node_rank);
    layout.local_world_size = node < counts.size() ? counts[node] : counts.empty() ? 1 : counts.front();
  } else {
    layout.local_world_size = layout.world_size;
  }
  auto nodelist = env("SLURM_NODELIST");
  if (!nodelist) nodelist = env("SLURM_JOB_NODELIST");
  if (nodelist) {
    std::vector<std::string> hosts = expand_slurm_nodelist(*nodelist);
    if (!hosts.empty()) layout.master_addr = hosts.front();
  }
  // SLURM names no port. One fixed default would let two jobs on a node reach each other's rendezvous store
  // (rank 1 of the second job claimed in the first's), so each job takes a port from its id, in 20000-29999:
  // below Linux's ephemeral ports (32768 and up), where no outgoing connection will be holding it.
  if (auto job = env_int(env, "SLURM_JOB_ID")) layout.master_port = 20000 + *job % 10000;
  // MASTER_ADDR/MASTER_PORT still win when the batch script exports them.
  layout.master_addr = env("MASTER_ADDR").value_or(layout.master_addr);
  layout.master_port = env_int(env, "MASTER_PORT").value_or(layout.master_port);
}

void read_openmpi(RankLayout& layout, const EnvLookup& env) {
  layout.source = "openmpi";
  layout.rank = *env_int(env, "OMPI_COMM_WORLD_RANK");
  layout.world_size = env_int(env, "OMPI_COMM_WORLD_SIZE").value_or(1);
  layout.local_rank = env_int(env, "OMPI_COMM_WORLD_LOCAL_RANK").value_or(0);
  layout.local_world_size = env_int(env, "OMPI_COMM_WORLD_LOCAL_SIZE").value_or(layout.world_size);
  // Not OMPI_COMM_WORLD_NODE_RANK: that is this process's rank among all jobs' processes on its node, not the
  // node's index. mpirun's default by-slot mapping fills nodes in rank order.
  layout.node_rank = layout.rank / std::max(layout.local_world_size, 1);
  layout.master_addr = env("MASTER_ADDR").value_or(layout.master_addr);
  layout.master_port = env_int(env, "MASTER_PORT").value_or(layout.master_port);
}

}  // namespace

EnvLookup process_environment() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* value = std::getenv(name.c_str());
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  };
}

void require_whole_rank_environment(const ExplicitLayout& given, const EnvLookup& env) {
  if (given.rank || given.world_size) return;
  if (const auto rank = env("RANK")) {
    if (env("WORLD_SIZE")) return;
    throw InvalidArgument(fmt::format("environment variable RANK={} is set without WORLD_SIZE; set WORLD_SIZE to "
                                      "the number of ranks too (tandem run sets both), or unset RANK to train alone",
                                      *rank));
  }
  if (env("SLURM_PROCID") || env("OMPI_COMM_WORLD_RANK")) return;
  for (const char* name : {"WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT"}) {
    if (const auto value = env(name)) {
      throw InvalidArgument(fmt::format("environment variable {}={} is set without RANK, which would leave this "
                                        "process training alone as world size 1; start the ranks with tandem run "
                                        "(which sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT), set RANK too, "
                                        "or unset {} to train alone",
                                        name, *value, name));
    }
  }
}

RankLayout detect_rank_layout(const ExplicitLayout& given, const EnvLookup& env) {
  RankLayout layout;
  if (env("RANK")) {
    read_torchrun(layout, env);
  } else if (env("SLURM_PROCID")) {
    read_slurm(layout, env);
  } else if (env("OMPI_COMM_WORLD_RANK")) {
    read_openmpi(layout, env);
  }
  // Local values from the environment are checked only when explicit values did not replace part of them.
  const bool local_from_environment = layout.source != "single" && !given.rank && !given.world_size && !given.local_rank;
  if (given.rank || given.world_size) {
    layout.source = "explicit";
    layout.rank = given.rank.value_or(layout.rank);
    layout.world_size = given.world_size.value_or(layout.world_size);
    layout.local_rank = given.local_rank.value_or(given.rank ? layout.rank : layout.local_rank);
    if (layout.local_world_size > layout.world_size) layout.local_world_size = layout.world_size;
  }
  if (given.local_rank) layout.local_rank = *given.local_rank;
  if (given.master_addr) layout.master_addr = *given.master_addr;
  if (given.master_port) layout.master_port = *given.master_port;

  if (layout.world_size < 1) {
    throw InvalidArgument(fmt::format("world size must be at least 1, got {} (from {})", layout.world_size, layout.source));
  }
  if (layout.rank < 0 || layout.rank >= layout.world_size) {
    throw InvalidArgument(fmt::format("rank {} is outside world size {} (from {}); ranks run from 0 to {}", layout.rank,
                                      layout.world_size, layout.source, layout.world_size - 1));
  }
  if (layout.local_rank < 0) {
    throw InvalidArgument(fmt::format("local rank must not be negative, got {}", layout.local_rank));
  }
  if (local_from_environment && (layout.local_world_size < 1 || layout.local_rank >= layout.local_world_size)) {
    throw InvalidArgument(fmt::format("local rank {} is outside local world size {} (from {}); local ranks run "
                                      "from 0 to {}",
                                      layout.local_rank, layout.local_world_size, layout.source,
                                      layout.local_world_size - 1));
  }
  if (layout.master_port < 0 || layout.master_port > 65535) {
    throw InvalidArgument(fmt::format("master port {} is outside 0..65535", layout.master_port));
  }
  return layout;
}

}  // namespace tandem::comm
