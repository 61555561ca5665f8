#include "tandem/launch/launch_options.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/cuda.h>

#include <sys/resource.h>
#include <unistd.h>

#include <climits>
#include <ctime>
#include <set>

#include "tandem/comm/rank_layout.h"
#include "tandem/util/error.h"
#include "tandem/util/needs.h"

namespace tandem::launch {

std::string LaunchPlan::log_path(int local_rank) const {
  if (log_dir.empty()) return {};
  return fmt::format("{}/rank{}.log", log_dir, global_rank(local_rank));
}

std::vector<int> parse_gpu_list(const std::string& text) {
  std::vector<int> gpus;
  if (text.empty()) return gpus;
  size_t start = 0;
  while (true) {
    size_t comma = text.find(',', start);
    std::string entry = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (entry.empty() || entry.size() > 6 || entry.find_first_not_of("0123456789") != std::string::npos) {
      throw InvalidArgument(
          fmt::format("`gpus` '{}': '{}' is not a GPU index; list them like `gpus` 0,1 or `gpus` 2,7", text, entry));
    }
    gpus.push_back(std::stoi(entry));
    if (comma == std::string::npos) return gpus;
    start = comma + 1;
  }
}

int visible_gpu_count() { return static_cast<int>(torch::cuda::device_count()); }

ProcessLimits ProcessLimits::of_this_process() {
  const auto soft_limit = [](int resource) -> uint64_t {
    rlimit limit{};
    if (::getrlimit(resource, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return UINT64_MAX;
    return limit.rlim_cur;
  };
  return {soft_limit(RLIMIT_NOFILE), soft_limit(RLIMIT_NPROC)};
}

namespace {

// The launcher's own open files besides the workers' pipes and logs: stdio, the signal self-pipe, the store's
// socket or files, LibTorch's. Generous, since running out halfway through starting the workers is the failure
// this margin is for.
constexpr uint64_t kLauncherOwnFiles = 64;

// Refuses a number of workers that this node cannot hold, naming the limit and what to do about it.
void check_workers_fit(const LaunchOptions& options, int nproc_per_node, const ProcessLimits& limits) {
  if (nproc_per_node > kMaxWorkersPerNode) {
    throw InvalidArgument(fmt::format(
        "`nproc_per_node` {} is more workers than tandem run starts on one node (at most {}); start one per GPU "
        "or per core, and spread a larger job over more nodes with `nnodes`",
        nproc_per_node, kMaxWorkersPerNode));
  }
  const uint64_t files_per_worker = options.log_dir.empty() ? 2 : 3;
  const uint64_t files = kLauncherOwnFiles + files_per_worker * static_cast<uint64_t>(nproc_per_node);
  if (files > limits.open_files) {
    const uint64_t fitting = limits.open_files > kLauncherOwnFiles
                                 ? (limits.open_files - kLauncherOwnFiles) / files_per_worker
                                 : 0;
    throw InvalidArgument(fmt::format(
        "`nproc_per_node` {} needs {} open files in the launcher ({} per worker, {} of its own), but this process "
        "may open {} (ulimit -n); start at most {} workers per node, or raise the limit with ulimit -n {}",
        nproc_per_node, files, files_per_worker, kLauncherOwnFiles, limits.open_files, fitting, files));
  }
  if (static_cast<uint64_t>(nproc_per_node) > limits.processes) {
    throw InvalidArgument(fmt::format(
        "`nproc_per_node` {} is more processes than this user may run ({}, ulimit -u); start fewer workers per "
        "node, or raise the limit with ulimit -u",
        nproc_per_node, limits.processes));
  }
}

bool is_ipv4_loopback(const std::string& address) {
  in_addr parsed{};
  return ::inet_pton(AF_INET, address.c_str(), &parsed) == 1 && (ntohl(parsed.s_addr) >> 24) == 127;
}

// The launch time and the launcher's pid: unique on this machine, and sorted by time among runs/.
std::string fresh_run_id() {
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  ::localtime_r(&now, &local);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &local);
  return fmt::format("{}-{}", stamp, ::getpid());
}

bool is_folder_name(const std::string& text) {
  if (text.empty() || text == "." || text == "..") return false;
  for (char c : text) {
    const bool plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
                       c == '_' || c == '-';
    if (!plain) return false;
  }
  return true;
}

// The elastic settings of an rdzv_backend c10d job, or none for a static one; refuses flags of the other mode.
std::optional<ElasticSettings> plan_elastic(const LaunchOptions& options) {
  const int max_nodes = options.max_nnodes == 0 ? options.nnodes : options.max_nnodes;
  if (max_nodes < options.nnodes) {
    throw InvalidArgument(fmt::format("`nnodes` {}:{}: the least number of nodes is above the most; give MIN:MAX "
                                      "with MIN <= MAX",
                                      options.nnodes, max_nodes));
  }
  if (options.rdzv_backend.empty() || options.rdzv_backend == "static") {
    if (max_nodes != options.nnodes) {
      throw InvalidArgument(fmt::format(
          "`nnodes` {}:{} is an elastic job, which needs a rendezvous: add `rdzv_backend` c10d and "
          "`rdzv_endpoint` HOST:PORT (the host whose agent serves it), or give one number of nodes",
          options.nnodes, max_nodes));
    }
    if (!options.rdzv_endpoint.empty() || !options.rdzv_conf.empty()) {
      throw InvalidArgument(fmt::format("`{}` is for an elastic job: add `rdzv_backend` c10d, or use "
                                        "`master_addr` and `master_port` for a static one",
                                        options.rdzv_endpoint.empty() ? "rdzv_conf" : "rdzv_endpoint"));
    }
    return std::nullopt;
  }
  if (options.rdzv_backend != "c10d") {
    throw InvalidArgument(fmt::format("`rdzv_backend` '{}' is not one tandem run knows: use c10d (an elastic job "
                                      "whose agents meet in a TCPStore) or static",
                                      options.rdzv_backend));
  }
  if (options.node_rank) {
    throw InvalidArgument(fmt::format("`node_rank` {} with `rdzv_backend` c10d: an elastic job ranks its nodes in "
                                      "the order they join each round; leave `node_rank` out",
                                      *options.node_rank));
  }
  if (options.master_addr || options.master_port) {
    throw InvalidArgument(fmt::format("`{}` with `rdzv_backend` c10d: the workers meet at `rdzv_endpoint`; leave "
                                      "`master_addr` and `master_port` out",
                                      options.master_addr ? "master_addr" : "master_port"));
  }
  if (options.rdzv_endpoint.empty()) {
    throw InvalidArgument(needs("`rdzv_backend` c10d", "`rdzv_endpoint` HOST:PORT",
                                "the host whose agent serves the job's store, the same on every node"));
  }
  if (options.run_id.empty()) {
    throw InvalidArgument(needs("`rdzv_backend` c10d", "`run_id`", "the job's id, the same on every node"));
  }
  ElasticSettings settings;
  settings.min_nodes = options.nnodes;
  settings.max_nodes = max_nodes;
  parse_rendezvous_endpoint(options.rdzv_endpoint, settings);
  parse_rendezvous_conf(options.rdzv_conf, settings);
  return settings;
}

// `nnodes` and this node's place among them.
void plan_nodes(const LaunchOptions& options, LaunchPlan& plan) {
  if (options.nnodes < 1) throw InvalidArgument(fmt::format("`nnodes` must be at least 1, got {}", options.nnodes));
  const int node_rank = options.node_rank.value_or(0);
  if (node_rank < 0 || node_rank >= options.nnodes) {
    throw InvalidArgument(fmt::format("`node_rank` {} is outside 0..{} for `nnodes` {}", node_rank,
                                      options.nnodes - 1, options.nnodes));
  }
  plan.nnodes = options.nnodes;
  plan.node_rank = node_rank;
}

// The GPUs this node's ranks take, and how many ranks it starts.
void plan_ranks_per_node(const LaunchOptions& options, int gpu_count, const ProcessLimits& limits, LaunchPlan& plan) {
  std::set<int> seen;
  for (int gpu : options.gpus) {
    if (gpu < 0) throw InvalidArgument(fmt::format("`gpus` lists {}, but GPU indices start at 0", gpu));
    if (!seen.insert(gpu).second) throw InvalidArgument(fmt::format("`gpus` lists GPU {} twice", gpu));
  }
  plan.gpus = options.gpus;
  const int default_nproc = !plan.gpus.empty() ? static_cast<int>(plan.gpus.size()) : std::max(gpu_count, 1);
  plan.nproc_per_node = options.nproc_per_node.value_or(default_nproc);
  if (plan.nproc_per_node < 1) {
    throw InvalidArgument(fmt::format("`nproc_per_node` must be at least 1, got {}", plan.nproc_per_node));
  }
  if (!plan.gpus.empty() && plan.nproc_per_node > static_cast<int>(plan.gpus.size())) {
    throw InvalidArgument(fmt::format(
        "`nproc_per_node` {} asks for more ranks than the {} GPU(s) listed in `gpus` {}; list more GPUs or "
        "start fewer ranks per node",
        plan.nproc_per_node, plan.gpus.size(), fmt::join(plan.gpus, ",")));
  }
  check_workers_fit(options, plan.nproc_per_node, limits);
  if (plan.nnodes > INT_MAX / plan.nproc_per_node) {
    throw InvalidArgument(fmt::format("`nnodes` {} times `nproc_per_node` {} is more ranks than a job can have ({})",
                                      plan.nnodes, plan.nproc_per_node, INT_MAX));
  }
}

// Where the ranks meet: the elastic job's endpoint, or node 0's address and port.
void plan_store_address(const LaunchOptions& options, LaunchPlan& plan) {
  if (plan.elastic) {
    plan.master_addr = plan.elastic->host;
    plan.master_port = plan.elastic->port;
  } else if (plan.nnodes > 1 && !options.master_addr) {
    throw InvalidArgument(needs(fmt::format("`nnodes` {}", plan.nnodes), "`master_addr`",
                                "the host of node 0, the same on every node"));
  }
  if (!plan.elastic) plan.master_addr = options.master_addr.value_or("127.0.0.1");
  if (plan.master_addr.empty()) throw InvalidArgument("`master_addr` must not be empty");
  if (!plan.elastic && plan.nnodes == 1 && !is_ipv4_loopback(plan.master_addr)) {
    throw InvalidArgument(fmt::format(
        "`master_addr` {} with `nnodes` 1: the rendezvous of one node stays on this machine; give a loopback "
        "address such as 127.0.0.1, or leave `master_addr` out",
        plan.master_addr));
  }

  const int port = options.master_port.value_or(0);
  if (port < 0 || port > 65535) throw InvalidArgument(fmt::format("`master_port` {} is outside 0..65535", port));
  if (plan.elastic) {
    // The endpoint's port, set above.
  } else if (port != 0 || plan.nnodes == 1) {
    plan.master_port = port;
  } else if (!options.master_port) {
    plan.master_port = comm::kDefaultMasterPort;
  } else {
    throw InvalidArgument(fmt::format(
        "`master_port` 0 picks a port on this machine only, but `nnodes` {} needs every node to name the same "
        "port; pass one explicitly (or leave it out for {})",
        plan.nnodes, comm::kDefaultMasterPort));
  }
}

// What the launcher does when workers fail or stop, and the run's name.
void plan_restarts(const LaunchOptions& options, LaunchPlan& plan) {
  if (options.grace_period.count() < 0) throw InvalidArgument("`grace_period` must not be negative");
  plan.grace_period = options.grace_period;

  if (options.max_restarts < 0) {
    throw InvalidArgument(fmt::format("`max_restarts` must not be negative, got {}", options.max_restarts));
  }
  // Each node's launcher restarts only its own workers, and the ranks of other nodes would meet the restarted
  // ones in the store of an attempt that is over: the nodes would have to agree on every restart first.
  if (options.max_restarts > 0 && plan.nnodes > 1 && !plan.elastic) {
    throw InvalidArgument(fmt::format(
        "`max_restarts` {} with `nnodes` {}: tandem run restarts the workers of one node only, or of every node "
        "in an elastic job; add `rdzv_backend` c10d and `rdzv_endpoint` HOST:PORT, or restart the job from outside",
        options.max_restarts, plan.nnodes));
  }
  plan.max_restarts = options.max_restarts;
  // Across nodes the memberships are decided by the agent that serves the elastic job's store; a static job has
  // no such agent, and no agent that learns of another node's loss.
  if (options.recovery == Recovery::kInJob && plan.nnodes > 1 && !plan.elastic) {
    throw InvalidArgument(fmt::format(
        "`recovery` in-job with `nnodes` {} needs an elastic job, whose agents decide the memberships together: add "
        "`rdzv_backend` c10d and `rdzv_endpoint` HOST:PORT, or use `recovery` restart",
        plan.nnodes));
  }
  plan.recovery = options.recovery;
  plan.log_dir = options.log_dir;
  if (!options.run_id.empty() && !is_folder_name(options.run_id)) {
    throw InvalidArgument(fmt::format(
        "`run_id` '{}' names the run's folder under runs/: use letters, digits, '.', '_' and '-' only",
        options.run_id));
  }
  plan.run_id = options.run_id.empty() ? fresh_run_id() : options.run_id;
}

}  // namespace

LaunchPlan plan_launch(const LaunchOptions& options, int gpu_count, const ProcessLimits& limits) {
  LaunchPlan plan;
  if (options.command.empty()) {
    throw InvalidArgument("no command to run: put the program and its arguments after `--`, e.g. tandem run -- ./train");
  }
  plan.command = options.command;
  plan_nodes(options, plan);
  plan.elastic = plan_elastic(options);
  plan_ranks_per_node(options, gpu_count, limits, plan);
  plan_store_address(options, plan);
  plan_restarts(options, plan);
  return plan;
}

std::string to_string(Recovery recovery) { return recovery == Recovery::kInJob ? "in-job" : "restart"; }

Recovery parse_recovery(const std::string& name) {
  for (Recovery recovery : {Recovery::kRestart, Recovery::kInJob}) {
    if (name == to_string(recovery)) return recovery;
  }
  throw InvalidArgument(fmt::format("`recovery` '{}' is not one of restart, in-job", name));
}

}  // namespace tandem::launch
