// `tandem bench rendezvous`: the elastic control plane at scale, simulated: N agents as threads of this process
// against one real c10d TCPStore, running the launcher's rendezvous and heartbeat code (bench/rendezvous/rendezvous_bench.h).
//   tandem bench rendezvous [--agents 64,256,1024] [--keep-alive-interval 5] [--keep-alive-max-attempt 3]
//                           [--last-call 3] [--heartbeat-ticks 3]
#include <memory>
#include <vector>

#include "bench/bench_commands.h"
#include "apps/flag_checks.h"
#include "bench/rendezvous/rendezvous_bench.h"

namespace tandem::app {
namespace {

// The most agents one process simulates: two threads and four open files each.
constexpr int kMostAgents = 4096;

struct BenchRendezvousFlags {
  bench::RendezvousBenchOptions bench;
  std::vector<int> agents{64, 256, 1024};
  double keep_alive_interval_seconds = 5;
  double last_call_seconds = 3;
};

std::chrono::milliseconds milliseconds_of(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
}

int run_bench_rendezvous(BenchRendezvousFlags& flags) {
  bench::RendezvousBenchOptions options = flags.bench;
  options.keep_alive_interval = milliseconds_of(flags.keep_alive_interval_seconds);
  options.last_call = milliseconds_of(flags.last_call_seconds);
  // Every size's open files are checked before the first runs.
  for (int agents : flags.agents) bench::ensure_descriptors(agents);
  std::vector<bench::RendezvousBenchResult> results;
  for (int agents : flags.agents) {
    options.agents = agents;
    results.push_back(bench::run_rendezvous_bench(options));
  }
  bench::print_rendezvous_table(results, options);
  return 0;
}

const CommandRegistration kBenchRendezvous{
    bench_commands(),
    "rendezvous",
    "Elastic rendezvous at scale, simulated: N agents (threads) against one TCPStore: time to form a round, store "
    "operations and bytes per agent, re-forming after 1% die, a phantom agent",
    [](CLI::App& command) -> std::function<int()> {
      auto flags = std::make_shared<BenchRendezvousFlags>();
      command.add_option("--agents", flags->agents, "Numbers of simulated agents, one run each: e.g. 64,256,1024")
          ->delimiter(',')
          ->capture_default_str()
          ->check(between<int>(2, kMostAgents));
      command.add_option("--keep-alive-interval", flags->keep_alive_interval_seconds,
                         "Seconds between an agent's heartbeats (rdzv-conf keep_alive_interval)")
          ->capture_default_str()
          ->check(between<double>(0.05, 600));
      command.add_option("--keep-alive-max-attempt", flags->bench.keep_alive_max_attempt,
                         "Heartbeats a node may miss before it is lost (rdzv-conf keep_alive_max_attempt)")
          ->capture_default_str()
          ->check(between<int>(2, 1000));
      command.add_option("--last-call", flags->last_call_seconds,
                         "Seconds without a newcomer that close a round below its most nodes (rdzv-conf "
                         "last_call_timeout)")
          ->capture_default_str()
          ->check(between<double>(0.05, 600));
      command.add_option("--heartbeat-ticks", flags->bench.heartbeat_ticks,
                         "Heartbeat ticks of every agent measured before 1% of them die")
          ->capture_default_str()
          ->check(between<int>(1, 1000));
      return [flags]() -> int { return run_bench_rendezvous(*flags); };
    }};

}  // namespace
}  // namespace tandem::app
