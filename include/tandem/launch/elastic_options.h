#pragma once
// The settings of an elastic job (`tandem run --nnodes MIN:MAX --rdzv-backend c10d --rdzv-endpoint HOST:PORT`,
// torchrun's spellings; docs/launcher.md, "Elastic jobs"): how many nodes, where the agents meet, and the
// timings of their rounds and heartbeats, which --rdzv-conf sets with torchrun's keys.
#include <chrono>
#include <string>

namespace tandem::launch {

// torchrun's c10d endpoint port, when --rdzv-endpoint names only a host.
inline constexpr int kDefaultRendezvousPort = 29400;

struct ElasticSettings {
  int min_nodes = 1;
  int max_nodes = 1;
  // The store's host and port: the agent on the host that owns `host` serves it, every other agent connects.
  std::string host;
  int port = kDefaultRendezvousPort;
  // How long an agent waits for `min_nodes` agents, for the store, or to get back into the job after losing the
  // store, before it gives up (join_timeout).
  std::chrono::milliseconds join_timeout{std::chrono::seconds(600)};
  // Once `min_nodes` have joined a round, how long without a newcomer closes it below `max_nodes`
  // (last_call_timeout). Short by default: a node's agent joins within a second of seeing the round.
  std::chrono::milliseconds last_call{std::chrono::seconds(3)};
  // Every agent of a running round adds to its heartbeat this often; one whose heartbeat stood still for
  // keep_alive_max_attempt intervals is lost (keep_alive_interval, keep_alive_max_attempt).
  std::chrono::milliseconds keep_alive_interval{std::chrono::seconds(5)};
  int keep_alive_max_attempt = 3;
  // How long a node's agent may take to stop its workers once it starts stopping them: --grace-period and a
  // margin (set by the agent, not --rdzv-conf; every node gives the same --grace-period). A round that follows a
  // node's loss waits this long after the loss before it closes: the lost node's agent starts stopping its
  // workers by the time the others find it lost (docs/launcher.md, "A cut link"), so they are gone by then.
  std::chrono::milliseconds worker_stop_time{0};
  // Under --recovery in-job (set by the agent from the plan): a lost node other than rank 0's leaves a vacancy in
  // the running round, which a node that comes takes, instead of ending the round (round_rendezvous.h).
  bool in_job_recovery = false;

  std::chrono::milliseconds heartbeat_lost_after() const { return keep_alive_interval * keep_alive_max_attempt; }
};

// Reads "--nnodes": "N" (min = max = N) or "MIN:MAX". Throws InvalidArgument naming `nnodes`.
void parse_node_range(const std::string& text, int& min_nodes, int& max_nodes);

// Reads "--rdzv-endpoint": "HOST:PORT", "HOST" (port kDefaultRendezvousPort) or "[IPv6]:PORT" into
// settings.host and settings.port. Throws InvalidArgument naming `rdzv_endpoint`.
void parse_rendezvous_endpoint(const std::string& text, ElasticSettings& settings);

// Reads "--rdzv-conf": "key=value,key=value" with torchrun's keys join_timeout, last_call_timeout,
// keep_alive_interval (seconds, fractions allowed) and keep_alive_max_attempt (2 to 1000). Throws InvalidArgument naming
// `rdzv_conf` and the entry for an unknown key or a value out of range.
void parse_rendezvous_conf(const std::string& text, ElasticSettings& settings);

}  // namespace tandem::launch
