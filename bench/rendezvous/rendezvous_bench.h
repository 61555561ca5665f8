#pragma once
// The measurement behind `tandem bench rendezvous`: the control plane of an elastic job at scale, without
// training. N simulated agents, threads of this process, each with its own connection to one real c10d TCPStore
// on loopback (the first agent's AgentStore serves it, as the store host's agent does), run the launcher's own
// code: AgentStore to connect, RoundRendezvous to form rounds, HeartbeatWatch to beat and watch while a round
// runs. Each connection is counted (comm::CountingStore) under the agents' key prefix, so the figures are what
// each agent sends and receives, keys and values. The scenario:
//   1. every agent enters one job and polls until the first round closes with all N (min_nodes is N minus the
//      agents that will die, max_nodes N);
//   2. every agent beats and watches, each keep_alive_interval, until each has ticked `heartbeat_ticks` times;
//   3. 1% of the agents (at least one) die at once, silently, as a killed host does; the survivors find them
//      lost, end the round and form the next;
//   4. on a second job of the same store, a phantom agent enters and vanishes before the round closes, then the
//      survivors enter: the round must close with the survivors alone.
// Nothing is timed against a limit: the figures are for the table (and the shape test, tests/bench).
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace tandem::bench {

struct RendezvousBenchOptions {
  int agents = 64;
  // The job's timings, which --rdzv-conf sets (ElasticSettings' defaults).
  std::chrono::milliseconds keep_alive_interval{5000};
  int keep_alive_max_attempt = 3;
  std::chrono::milliseconds last_call{3000};
  // Heartbeat ticks of every agent measured before any agent dies.
  int heartbeat_ticks = 3;
};

// What one agent's store connection carried in one call (enter, poll_round) or one heartbeat tick.
struct CallTraffic {
  int64_t operations = 0;
  int64_t bytes = 0;  // sent and received
};

struct RendezvousBenchResult {
  int agents = 0;
  // 1: from the agents' start to the last one knowing it is a member.
  double form_seconds = 0;
  // Per agent: its enter(), its poll_round() calls and what they cost, summed.
  std::vector<CallTraffic> enter_traffic;
  std::vector<int64_t> polls;
  std::vector<CallTraffic> poll_traffic;
  // 2: every tick of every agent (beat and watch), and the longest one.
  std::vector<CallTraffic> tick_traffic;
  double longest_tick_seconds = 0;
  // Why the first round ended before any agent died, where it did (a live node taken for lost: ticks too slow
  // for keep_alive_interval x keep_alive_max_attempt); empty otherwise.
  std::string early_end;
  // 3: how many died, from their death to the last survivor knowing it is a member of the next round, and who
  // that round took in.
  int died = 0;
  double reform_seconds = 0;
  int reformed_nodes = 0;                // the next round's size as every survivor saw it (-1: they disagree)
  bool reformed_with_the_survivors = false;  // every survivor in it, in one round, and no one else
  // 4: the survivors' round in the second job.
  int phantom_round_nodes = 0;
  bool phantom_was_member = false;
};

// Runs the scenario above. Throws Error when an agent never got where the scenario needs it within the job's
// join_timeout (the store stopped answering), saying which step.
RendezvousBenchResult run_rendezvous_bench(const RendezvousBenchOptions& options);

// The means of a result's per-call figures.
double mean_operations(const std::vector<CallTraffic>& calls);
double mean_bytes(const std::vector<CallTraffic>& calls);

// File descriptors the scenario needs for `agents` agents (each agent's connection, its server side, its watch's
// pipe), and a check of the process's limit that raises it up to the hard limit where needed. Throws
// InvalidArgument naming --agents when the hard limit is too low.
int descriptors_needed(int agents);
void ensure_descriptors(int agents);

// The table of `tandem bench rendezvous`, one row per result.
void print_rendezvous_table(const std::vector<RendezvousBenchResult>& results, const RendezvousBenchOptions& options);

}  // namespace tandem::bench
