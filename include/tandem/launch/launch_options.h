#pragma once
// What `tandem run` was asked to do (LaunchOptions, straight from the command line) and what it will do
// (LaunchPlan: every default filled in and every value checked). Turning one into the other is the only place
// where the launcher's defaults live.
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tandem/launch/elastic_options.h"

namespace tandem::launch {

inline constexpr std::chrono::milliseconds kDefaultGracePeriod{5000};
// More workers than this on one node is a typo, not a job: one worker per GPU or per core stays far below it.
inline constexpr int kMaxWorkersPerNode = 1024;

// What the system lets the launcher hold while it runs nproc_per_node workers: it keeps two files open per worker
// (the pipes of its stdout and stderr) and a third with a log directory, and each worker is a process of the user.
// Checked in plan_launch, so that too many workers are refused before the first starts, not found out when
// fork or pipe fails thousands of workers later.
struct ProcessLimits {
  uint64_t open_files = UINT64_MAX;  // RLIMIT_NOFILE's soft limit (ulimit -n)
  uint64_t processes = UINT64_MAX;   // RLIMIT_NPROC's soft limit (ulimit -u); unlimited as UINT64_MAX

  static ProcessLimits of_this_process();
};

enum class Recovery { kRestart, kInJob };
// "restart", "in-job"; parse_recovery throws InvalidArgument naming both.
std::string to_string(Recovery recovery);
Recovery parse_recovery(const std::string& name);

struct LaunchOptions {
  // Workers on this node; absent: one per GPU in --gpus, else one per visible GPU, else 1.
  std::optional<int> nproc_per_node;
  // Nodes in the job; an elastic job (rdzv_backend c10d) runs on nnodes to max_nnodes of them.
  int nnodes = 1;
  // 0: nnodes. Above nnodes only with rdzv_backend c10d (--nnodes MIN:MAX).
  int max_nnodes = 0;
  // Absent: 0. Refused with rdzv_backend c10d, where a node's rank is its place in each round.
  std::optional<int> node_rank;
  // "" or "static": the nodes are given their ranks (node_rank, master_addr). "c10d": an elastic job whose agents
  // meet in the store at rdzv_endpoint (elastic_options.h).
  std::string rdzv_backend;
  std::string rdzv_endpoint;
  std::string rdzv_conf;
  // Absent: 127.0.0.1 on a single node, where it must be an IPv4 loopback address (the store stays on this
  // machine); required with nnodes > 1 (every node must name the same host).
  std::optional<std::string> master_addr;
  // Absent or 0 on a single node: a free port on this machine, which launch() binds for its store. Absent with
  // nnodes > 1: kDefaultMasterPort, because the other nodes cannot learn a port picked here.
  std::optional<int> master_port;
  // Non-empty: each rank's output is also written to log_dir/rank<r>.log.
  std::string log_dir;
  // Non-empty: CUDA_VISIBLE_DEVICES for every worker, and the default nproc_per_node.
  std::vector<int> gpus;
  // After a worker fails (or the launcher is signalled), how long the others get between SIGTERM and SIGKILL.
  std::chrono::milliseconds grace_period = kDefaultGracePeriod;
  // How many times a failed group of workers is stopped and started again, as torchrun's --max-restarts.
  int max_restarts = 0;
  // What a lost worker costs the others (docs/recovery.md): kRestart stops them all and starts the group again
  // from the newest checkpoint; kInJob keeps them training and starts a replacement that they take in, each
  // replacement counting against max_restarts. kInJob runs on one node or in an elastic job.
  Recovery recovery = Recovery::kRestart;
  // The job's id, the same for every attempt (torchrun's --rdzv-id, TORCHELASTIC_RUN_ID): tandem train keeps a
  // run without --run-dir in runs/<run_id>, so a restarted attempt continues it. Empty: a new one, the time and
  // the launcher's pid. Letters, digits, '.', '_' and '-' only, since it names a folder.
  std::string run_id;
  // The program and its arguments, run once per local rank.
  std::vector<std::string> command;
};

struct LaunchPlan {
  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  // 0 on a single node: launch() binds a free one.
  int master_port = 0;
  std::string log_dir;
  std::vector<int> gpus;
  std::chrono::milliseconds grace_period = kDefaultGracePeriod;
  int max_restarts = 0;
  Recovery recovery = Recovery::kRestart;
  std::string run_id;
  std::vector<std::string> command;
  // Set for an elastic job (rdzv_backend c10d); then nnodes and node_rank are those of the current round.
  std::optional<ElasticSettings> elastic;

  int world_size() const { return nnodes * nproc_per_node; }
  int global_rank(int local_rank) const { return node_rank * nproc_per_node + local_rank; }
  // log_dir/rank<r>.log, or empty without a log directory.
  std::string log_path(int local_rank) const;
};

// Fills in the defaults and checks the options; throws InvalidArgument with one line naming the option. gpu_count
// is the number of visible GPUs and `limits` what this process may hold (parameters so tests need neither a GPU
// nor a changed ulimit). Binds nothing: on one node, launch() binds the master port when it starts the store.
LaunchPlan plan_launch(const LaunchOptions& options, int gpu_count,
                       const ProcessLimits& limits = ProcessLimits::of_this_process());

// "2,7" -> {2, 7}; "" -> {}. Throws InvalidArgument naming the entry that is not a GPU index.
std::vector<int> parse_gpu_list(const std::string& text);

// The number of GPUs LibTorch sees (0 on a CPU-only build).
int visible_gpu_count();

}  // namespace tandem::launch
