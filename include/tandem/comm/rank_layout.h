#pragma once
// Where this process sits in the job: its rank, the world size, its place on its node, and the address of the
// rendezvous master. Read from, in order: explicit values, torchrun's variables (what `tandem run` sets),
// SLURM's, Open MPI's; with none of them the process runs alone (world size 1).
#include <functional>
#include <optional>
#include <string>

namespace tandem::comm {

inline constexpr int kDefaultMasterPort = 29500;

struct RankLayout {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = kDefaultMasterPort;
  // TORCHELASTIC_USE_AGENT_STORE=True: the launcher serves the store at master_addr:master_port (torchrun's agent
  // store, `tandem run` on one node), so rank 0 connects to it like every other rank instead of serving one.
  bool launcher_serves_store = false;
  // TORCHELASTIC_RESTART_COUNT: how often the launcher has restarted the workers (0 on the first start). In the
  // launcher's store each attempt rendezvouses under its own prefix, as PyTorch's env:// does, so that no key of
  // a failed attempt reaches the next one.
  int restart_count = 0;
  // TANDEM_STORE_FILE: the FileStore that `tandem run` made for a single-node run where LibTorch's TCPStore
  // cannot be kept on loopback (docs/launcher.md); env:// uses it instead of master_addr:master_port.
  std::string store_file;
  // Which source the layout came from: "explicit", "env", "slurm", "openmpi" or "single".
  std::string source = "single";

  bool distributed() const { return world_size > 1; }
};

// Values given by the caller; any that are set win over the environment.
struct ExplicitLayout {
  std::optional<int> rank;
  std::optional<int> world_size;
  std::optional<int> local_rank;
  std::optional<std::string> master_addr;
  std::optional<int> master_port;
};

// Returns the value of an environment variable, or nullopt when unset. Tests pass a map instead of the process
// environment.
using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;
EnvLookup process_environment();

// Throws InvalidArgument, naming the variable, when a value is malformed or inconsistent (rank >= world size).
RankLayout detect_rank_layout(const ExplicitLayout& given = {}, const EnvLookup& env = process_environment());

// Throws InvalidArgument, naming the variable, when the environment holds part of torchrun's set only: WORLD_SIZE,
// LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR or MASTER_PORT without RANK (and no SLURM or Open MPI
// rank), or RANK without WORLD_SIZE. detect_rank_layout() reads either as a process alone, which is right for a
// helper that only asks how many ranks share its host; a process starting a job (init_process_group) would train
// alone as world size 1 where a launcher script meant it to be one rank of several. Explicit values skip it.
void require_whole_rank_environment(const ExplicitLayout& given = {}, const EnvLookup& env = process_environment());

}  // namespace tandem::comm
