// `tandem run`: starts one worker process per device with the torchrun environment, prefixes their output
// with the rank, and stops them all when one fails (docs/launcher.md).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>

#include "apps/command.h"
#include "apps/flag_checks.h"
#include "tandem/launch/elastic_options.h"
#include "tandem/launch/launch_options.h"
#include "tandem/launch/launcher.h"
#include "tandem/util/error.h"

namespace tandem::app {
namespace {

// Longer than any program needs to save its state after SIGTERM: more is a typo.
constexpr double kMaxGracePeriodSeconds = 24 * 3600;
// Restarts after which a job that keeps failing is better looked at than restarted again.
constexpr int kMaxRestarts = 1000;

// The flags bind straight to the launcher's own options, except two texts that a library parser reads into them
// when the command runs (as `tandem train` keeps --precision's): the parser's refusal names the field, which
// main.cpp writes as the flag.
struct RunFlags {
  launch::LaunchOptions options;
  std::string nnodes = "1";  // parse_node_range: nnodes and max_nnodes
  std::string gpus;          // parse_gpu_list
};

// The command as given: the library parses the two texts, plans the launch and runs it.
int run_launch(RunFlags& flags, const CLI::App& command) {
  launch::LaunchOptions& options = flags.options;
  // CLI11 keeps the "--" separator among the unused arguments; without it, a command's own flags would be
  // read as tandem's (`tandem run python -m x` vs. `tandem run -- python -m x`).
  std::vector<std::string> unused = command.remaining();
  if (!options.command.empty() && std::find(unused.begin(), unused.end(), "--") == unused.end()) {
    throw InvalidArgument("put the command after `--`: tandem run [flags] -- " + options.command.front() + " ...");
  }
  launch::parse_node_range(flags.nnodes, options.nnodes, options.max_nnodes);
  options.gpus = launch::parse_gpu_list(flags.gpus);
  // Counting GPUs initialises CUDA, so it is done only when the count is needed.
  const bool needs_gpu_count = !options.nproc_per_node && options.gpus.empty();
  return launch::launch(launch::plan_launch(options, needs_gpu_count ? launch::visible_gpu_count() : 0));
}

// After the flags in --help: what the workers get, how failures and signals end a run, and elastic jobs.
constexpr const char* kRunFooter =
    "Every worker gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT and\n"
    "OMP_NUM_THREADS (CPUs / workers, unless already set). Output lines are prefixed with the rank, e.g. \"[0] \".\n"
    "When a worker exits non-zero or is killed, the others get SIGTERM (SIGKILL after --grace-period) and\n"
    "tandem run exits with that worker's code (128 + signal), unless --max-restarts N allows a restart: then all the\n"
    "workers start again, with TORCHELASTIC_RESTART_COUNT 1, 2, ... N (0 at first) and TORCHELASTIC_MAX_RESTARTS N.\n"
    "Every attempt gets the same TORCHELASTIC_RUN_ID (--run-id), so tandem train without --run-dir continues the\n"
    "run of the first attempt (runs/<run id>) from its newest checkpoint.\n"
    "With --recovery in-job a lost worker (other than rank 0, whose loss restarts the group) stops nobody: the\n"
    "others go on without it within a second, and its replacement joins them at a step boundary.\n"
    "SIGINT/SIGTERM/SIGHUP are forwarded to every worker, and end the run without a restart.\n"
    "Elastic jobs (torchrun's c10d rendezvous): on every node,\n"
    "  tandem run --nnodes MIN:MAX --rdzv-backend c10d --rdzv-endpoint HOST:PORT --rdzv-id ID -- CMD...\n"
    "The agent on HOST serves the job's store (that node must not go); the agents form rounds of MIN to MAX\n"
    "nodes, and a lost node, a failed worker or a node joining starts a new round on every node with the new\n"
    "WORLD_SIZE and RANK. Failures count against --max-restarts, a joining node does not. --rdzv-conf sets\n"
    "join_timeout, last_call_timeout, keep_alive_interval (seconds) and keep_alive_max_attempt (docs/launcher.md).\n"
    "torchrun's spellings (--nproc_per_node, --node_rank, --master_addr, --master_port, --rdzv_backend, ...) are\n"
    "accepted too.";

std::function<int()> define_run(CLI::App& command) {
  auto flags = std::make_shared<RunFlags>();
  launch::LaunchOptions& o = flags->options;
  command.footer(kRunFooter);
  command.add_option("--nproc-per-node,--nproc_per_node", o.nproc_per_node,
                     "Workers on this node (default: GPUs in --gpus, else visible GPUs, else 1)")
      ->check(between<int>(1, launch::kMaxWorkersPerNode));
  command.add_option("--nnodes", flags->nnodes,
                     "Nodes in the job: N, or MIN:MAX for an elastic job (with --rdzv-backend c10d)")
      ->capture_default_str();
  command.add_option("--node-rank,--node_rank", o.node_rank, "This node's index, 0..nnodes-1 (static jobs only)")
      ->default_str("0")
      ->check(at_least<int>(0));
  command.add_option("--rdzv-backend,--rdzv_backend", o.rdzv_backend,
                     "c10d: an elastic job whose agents meet in a store at --rdzv-endpoint; static (default): "
                     "--node-rank and --master-addr");
  command.add_option("--rdzv-endpoint,--rdzv_endpoint", o.rdzv_endpoint,
                     "HOST[:PORT] (default port 29400) of the elastic job's store, served by the agent on HOST");
  command.add_option("--rdzv-conf,--rdzv_conf", o.rdzv_conf,
                     "key=value,... : join_timeout (600), last_call_timeout (3), keep_alive_interval (5) in seconds, "
                     "keep_alive_max_attempt (3)");
  command.add_option("--master-addr,--master_addr", o.master_addr,
                     "Host of node 0 (default 127.0.0.1; a loopback address with --nnodes 1, required "
                     "with --nnodes > 1)");
  command.add_option(
      "--master-port,--master_port", o.master_port,
      "Rendezvous port on node 0. Absent or 0 on one node: a free port, held by the launcher's store. Absent "
      "with --nnodes > 1: 29500, so that every node agrees without being told")
      ->check(between<int>(0, 65535));
  command.add_option("--log-dir,--log_dir", o.log_dir, "Also write each rank's output to DIR/rank<r>.log");
  // A plain string, not a CLI11 list: a list option would swallow the `--` that must precede the command.
  command.add_option("--gpus", flags->gpus, "GPU indices for the workers, e.g. 2,7 (sets CUDA_VISIBLE_DEVICES)");
  // Seconds on the command line, milliseconds in the options.
  const auto set_grace_period = [flags](double seconds) {
    flags->options.grace_period = std::chrono::milliseconds(std::llround(seconds * 1000));
  };
  command
      .add_option_function<double>("--grace-period", set_grace_period,
                                   "Seconds between SIGTERM and SIGKILL when stopping the workers")
      ->default_str(fmt::format("{}", launch::kDefaultGracePeriod.count() / 1000.0))
      ->check(between<double>(0, kMaxGracePeriodSeconds));
  command.add_option("--max-restarts,--max_restarts", o.max_restarts,
                     "Times to stop and restart all workers after one fails (one node, or every node of an elastic "
                     "job)")
      ->capture_default_str()
      ->check(between<int>(0, kMaxRestarts));
  command
      .add_option_function<std::string>(
          "--recovery", [flags](const std::string& name) { flags->options.recovery = launch::parse_recovery(name); },
          "What a lost worker costs the others. restart: all stop and start again from the newest checkpoint. "
          "in-job: the others keep training without it, and take in a replacement (counted by --max-restarts) "
          "healed from a peer over the network; in an elastic job a lost node's place is kept for a node that comes "
          "(one node or an elastic job; tandem train with --strategy ddp; docs/recovery.md)")
      ->default_str("restart")
      ->check(CLI::IsMember({"restart", "in-job"}));
  command.add_option("--run-id,--rdzv-id,--rdzv_id", o.run_id,
                     "The job's id, shared by every restart (TORCHELASTIC_RUN_ID; default: the start time and the "
                     "launcher's pid; required, the same on every node, with --rdzv-backend c10d). tandem train "
                     "keeps a run without --run-dir in runs/<run id>");
  command.add_option("command", o.command, "The program to run and its arguments, after --");
  // Everything after the first word of the command belongs to the command, even if it looks like our flags.
  command.positionals_at_end();

  return [flags, &command] { return run_launch(*flags, command); };
}

const CommandRegistration kRun{"run", "Start one worker process per device, like torchrun", define_run};

}  // namespace
}  // namespace tandem::app
