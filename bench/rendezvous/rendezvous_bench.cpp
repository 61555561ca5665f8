#include "bench/rendezvous/rendezvous_bench.h"

#include <fmt/format.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

// The heartbeat thread is private to the launcher; the simulation runs it as the agent does.
#include "src/launch/heartbeat_watch.h"
#include "tandem/comm/counting_store.h"
#include "tandem/launch/agent_store.h"
#include "tandem/launch/round_rendezvous.h"
#include "tandem/util/error.h"

namespace tandem::bench {
namespace {

using Clock = std::chrono::steady_clock;
using launch::ElasticSettings;
using launch::HeartbeatWatch;
using launch::RoundMembership;
using launch::RoundRendezvous;

// How often an agent polls a forming round, as elastic_agent.cpp's agents do.
constexpr std::chrono::milliseconds kAgentPoll{100};
// Beyond the descriptors of the agents, those of the process itself (LibTorch, the terminal, the phantom).
constexpr int kSpareDescriptors = 64;

double seconds_between(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

// A TCP port on loopback that nothing listens on now, for the store host's agent.
int free_loopback_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw Error("cannot open a socket to find a free port for the simulated store");
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  const bool bound = ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0 &&
                     ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0;
  ::close(fd);
  if (!bound) throw Error("cannot bind a loopback port for the simulated store");
  return ntohs(address.sin_port);
}

// The store traffic of `call` on `store`'s connection; nothing else may use the connection meanwhile.
template <typename Call>
CallTraffic traffic_of(const comm::CountingStore& store, Call&& call) {
  const comm::StoreTraffic before = store.traffic();
  call();
  const comm::StoreTraffic used = store.traffic().since(before);
  return {used.operations, used.bytes_sent + used.bytes_received};
}

void add_to(CallTraffic& sum, const CallTraffic& more) {
  sum.operations += more.operations;
  sum.bytes += more.bytes;
}

// One simulated node's agent: its own connection to the job's store, counted.
struct Agent {
  Agent(const ElasticSettings& settings, std::chrono::milliseconds store_timeout)
      : store(settings, store_timeout), counted(c10::make_intrusive<comm::CountingStore>(store.client())) {}

  // This agent's rounds of job `run_id`, under the agents' prefix as elastic_agent.cpp keeps them.
  std::unique_ptr<RoundRendezvous> join(const std::string& run_id, const ElasticSettings& settings,
                                        const std::string& node) const {
    return std::make_unique<RoundRendezvous>(
        c10::make_intrusive<c10d::PrefixStore>("/tandem_agents/" + run_id, counted), settings, node,
        std::map<std::string, std::string>{{"`nproc_per_node`", "1"}, {"command", "simulated"}});
  }

  launch::AgentStore store;
  c10::intrusive_ptr<comm::CountingStore> counted;
};

// What the agents' threads report, and what the main thread tells them.
struct Simulation {
  explicit Simulation(const RendezvousBenchOptions& options) : options(options), agents(options.agents) {}

  RendezvousBenchOptions options;
  ElasticSettings settings;          // the first job's
  ElasticSettings phantom_settings;  // the second job's
  std::vector<std::unique_ptr<Agent>> agents;
  std::vector<bool> dies;

  std::mutex mutex;
  std::condition_variable changed;
  // Per agent (guarded by mutex, but for the tick figures, which only the agent's own threads touch until the
  // agent's thread has ended).
  std::vector<std::optional<Clock::time_point>> formed, reformed;
  std::vector<std::optional<RoundMembership>> reformed_membership, phantom_job_membership;
  std::vector<bool> done_ticking;
  std::vector<std::vector<CallTraffic>> ticks;
  std::vector<double> longest_tick;
  std::string error;      // the first agent's failure, or why the main thread stopped the agents
  bool kill = false;
  bool phantom_gone = false;

  bool stopped() {
    std::lock_guard<std::mutex> lock(mutex);
    return !error.empty();
  }

  void report(const std::function<void()>& update) {
    std::lock_guard<std::mutex> lock(mutex);
    update();
    changed.notify_all();
  }
  // Waits until `done` (under the lock) or an agent failed; throws Error saying `what` did not happen otherwise.
  void wait_until(const std::function<bool()>& done, const std::string& what) {
    std::unique_lock<std::mutex> lock(mutex);
    const auto deadline = Clock::now() + settings.join_timeout;
    if (!changed.wait_until(lock, deadline, [&] { return done() || !error.empty(); })) {
      throw Error(fmt::format("simulated rendezvous: {} within {:.0f} s", what, settings.join_timeout.count() / 1000.0));
    }
    if (!error.empty()) throw Error("simulated rendezvous: " + error);
  }
};

// Polls `rounds` as an agent does until it is a member; adds each poll's traffic to `traffic`.
RoundMembership poll_until_member(Simulation& sim, RoundRendezvous& rounds, const comm::CountingStore& store,
                                  int64_t& polls, CallTraffic& traffic) {
  while (!sim.stopped()) {
    std::optional<RoundMembership> membership;
    add_to(traffic, traffic_of(store, [&] { membership = rounds.poll_round(Clock::now()); }));
    ++polls;
    if (membership) return *membership;
    std::this_thread::sleep_for(kAgentPoll);
  }
  throw Error("stopped");
}

// Agent `index`'s life in the scenario (rendezvous_bench.h).
void run_agent(Simulation& sim, int index, RendezvousBenchResult& result) {
  Agent& agent = *sim.agents[static_cast<size_t>(index)];
  const comm::CountingStore& store = *agent.counted;
  const std::string node = fmt::format("agent {}", index);
  std::unique_ptr<RoundRendezvous> rounds = agent.join("simulated", sim.settings, node);

  result.enter_traffic[index] = traffic_of(store, [&] { rounds->enter(Clock::now()); });
  poll_until_member(sim, *rounds, store, result.polls[index], result.poll_traffic[index]);
  sim.report([&] { sim.formed[index] = Clock::now(); });

  std::optional<launch::RoundEnd> end;
  {
    auto& ticks = sim.ticks[static_cast<size_t>(index)];
    const auto started = Clock::now();
    HeartbeatWatch watch(
        [&](Clock::time_point /*answer_by: the local store answers every call*/) -> std::optional<launch::RoundEnd> {
          std::optional<launch::RoundEnd> tick_end;
          const auto start = Clock::now();
          const CallTraffic traffic = traffic_of(store, [&] {
            rounds->beat();
            tick_end = rounds->watch(Clock::now());
          });
          sim.longest_tick[index] = std::max(sim.longest_tick[index], seconds_between(start, Clock::now()));
          if (static_cast<int>(ticks.size()) < sim.options.heartbeat_ticks) {
            ticks.push_back(traffic);
            if (static_cast<int>(ticks.size()) == sim.options.heartbeat_ticks) {
              sim.report([&] { sim.done_ticking[index] = true; });
            }
          }
          return tick_end;
        },
        sim.settings.keep_alive_interval, sim.settings.heartbeat_lost_after(), started);
    while (!watch.finished()) {
      bool die = false;
      bool stopped = false;
      {
        std::lock_guard<std::mutex> lock(sim.mutex);
        die = sim.kill && sim.dies[index];
        stopped = !sim.error.empty();
      }
      // A killed host says nothing: its heartbeat just stops.
      if (die || stopped) return;
      pollfd readable{watch.fd(), POLLIN, 0};
      ::poll(&readable, 1, static_cast<int>(kAgentPoll.count()));
    }
    end = watch.ended();
    if (!end) throw Error(fmt::format("{} lost the store while it watched: {}", node, watch.store_error()));
  }
  sim.report([&] {
    sim.done_ticking[index] = true;
    if (!sim.kill && result.early_end.empty()) result.early_end = end->reason;
  });

  rounds->next_round(Clock::now());
  int64_t polls = 0;
  CallTraffic traffic;
  const RoundMembership next = poll_until_member(sim, *rounds, store, polls, traffic);
  sim.report([&] {
    sim.reformed[index] = Clock::now();
    sim.reformed_membership[index] = next;
  });

  {
    std::unique_lock<std::mutex> lock(sim.mutex);
    sim.changed.wait(lock, [&] { return sim.phantom_gone || !sim.error.empty(); });
    if (!sim.error.empty()) return;
  }
  std::unique_ptr<RoundRendezvous> second = agent.join("simulated-phantom", sim.phantom_settings, node);
  second->enter(Clock::now());
  polls = 0;
  const RoundMembership with_phantom = poll_until_member(sim, *second, store, polls, traffic);
  sim.report([&] { sim.phantom_job_membership[index] = with_phantom; });
}

}  // namespace

double mean_operations(const std::vector<CallTraffic>& calls) {
  double sum = 0;
  for (const CallTraffic& call : calls) sum += static_cast<double>(call.operations);
  return calls.empty() ? 0 : sum / static_cast<double>(calls.size());
}

double mean_bytes(const std::vector<CallTraffic>& calls) {
  double sum = 0;
  for (const CallTraffic& call : calls) sum += static_cast<double>(call.bytes);
  return calls.empty() ? 0 : sum / static_cast<double>(calls.size());
}

int descriptors_needed(int agents) { return 4 * (agents + 1) + kSpareDescriptors; }

void ensure_descriptors(int agents) {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0) throw Error("cannot read this process's limit on open files");
  const rlim_t needed = static_cast<rlim_t>(descriptors_needed(agents));
  if (limit.rlim_cur >= needed) return;
  if (limit.rlim_max < needed) {
    throw InvalidArgument(fmt::format(
        "--agents {} needs about {} open files (a connection, its server side and a pipe per agent), but this "
        "process may open at most {} (ulimit -Hn); simulate fewer agents or raise the limit",
        agents, needed, static_cast<unsigned long long>(limit.rlim_max)));
  }
  limit.rlim_cur = needed;
  if (::setrlimit(RLIMIT_NOFILE, &limit) != 0) throw Error("cannot raise this process's limit on open files");
}

namespace {

// The job's settings for `options`, every agent made (the first serves the store) and the dying ones chosen;
// returns the agents' store timeout.
std::chrono::milliseconds set_up_simulation(Simulation& sim, const RendezvousBenchOptions& options, int dying) {
  const int n = options.agents;
  const int survivors = n - dying;
  sim.settings.host = "127.0.0.1";
  sim.settings.port = free_loopback_port();
  sim.settings.min_nodes = survivors;
  sim.settings.max_nodes = n;
  sim.settings.keep_alive_interval = options.keep_alive_interval;
  sim.settings.keep_alive_max_attempt = options.keep_alive_max_attempt;
  sim.settings.last_call = options.last_call;
  // The phantom must be seen gone before its round closes: it closes below its most nodes, after a last call
  // long enough for an agent that stopped beating to be seen standing still.
  sim.phantom_settings = sim.settings;
  sim.phantom_settings.min_nodes = survivors;
  sim.phantom_settings.max_nodes = 2 * n;
  sim.phantom_settings.last_call = std::max(options.last_call, 2 * sim.settings.heartbeat_lost_after() +
                                                                   sim.settings.keep_alive_interval);
  const auto store_timeout = std::max(sim.settings.heartbeat_lost_after(), std::chrono::milliseconds(1000));

  // The first agent serves the store; each of the others connects, as on a host of its own.
  for (auto& agent : sim.agents) agent = std::make_unique<Agent>(sim.settings, store_timeout);
  sim.dies.assign(static_cast<size_t>(n), false);
  // Spread over the agents, never the store host's: the job cannot lose that one.
  for (int k = 0; k < dying; ++k) sim.dies[static_cast<size_t>((k + 1) * n / (dying + 1))] = true;
  sim.formed.resize(n);
  sim.reformed.resize(n);
  sim.reformed_membership.resize(n);
  sim.phantom_job_membership.resize(n);
  sim.done_ticking.assign(static_cast<size_t>(n), false);
  sim.ticks.resize(n);
  sim.longest_tick.assign(static_cast<size_t>(n), 0);
  return store_timeout;
}

// The main thread's part of the scenario, while the agents' threads run: waits for each step, kills the dying
// agents, and lets the phantom enter the second job. `phantom` holds it until the agents are done with it.
void drive_rendezvous_scenario(Simulation& sim, std::chrono::milliseconds store_timeout, RendezvousBenchResult& result,
                    std::unique_ptr<Agent>& phantom) {
  const int n = result.agents;
  const auto all = [n](const std::function<bool(int)>& holds) {
    for (int index = 0; index < n; ++index) {
      if (!holds(index)) return false;
    }
    return true;
  };
  sim.wait_until([&] { return all([&](int i) { return sim.formed[i].has_value(); }); },
                 "not every agent became a member of the first round");
  sim.wait_until([&] { return all([&](int i) { return sim.done_ticking[i]; }); },
                 "not every agent's heartbeat ticked");
  const auto killed = Clock::now();
  sim.report([&] { sim.kill = true; });
  sim.wait_until([&] { return all([&](int i) { return sim.dies[i] || sim.reformed[i].has_value(); }); },
                 "the survivors did not all form the next round");
  Clock::time_point last_reformed = killed;
  for (int i = 0; i < n; ++i) {
    if (sim.reformed[i]) last_reformed = std::max(last_reformed, *sim.reformed[i]);
  }
  result.reform_seconds = seconds_between(killed, last_reformed);

  phantom = std::make_unique<Agent>(sim.settings, store_timeout);
  phantom->join("simulated-phantom", sim.phantom_settings, "phantom")->enter(Clock::now());
  sim.report([&] { sim.phantom_gone = true; });
  sim.wait_until([&] { return all([&](int i) { return sim.dies[i] || sim.phantom_job_membership[i].has_value(); }); },
                 "the survivors did not all form the second job's round");
}

// What the agents recorded, once their threads have ended.
void collect_rendezvous_results(const Simulation& sim, Clock::time_point start, int survivors, RendezvousBenchResult& result) {
  const int n = result.agents;
  Clock::time_point last_formed = start;
  for (const auto& formed : sim.formed) last_formed = std::max(last_formed, *formed);
  result.form_seconds = seconds_between(start, last_formed);
  for (int i = 0; i < n; ++i) {
    result.tick_traffic.insert(result.tick_traffic.end(), sim.ticks[i].begin(), sim.ticks[i].end());
    result.longest_tick_seconds = std::max(result.longest_tick_seconds, sim.longest_tick[i]);
  }
  // Every survivor in one round of exactly the survivors, and the second job's round without the phantom.
  std::vector<bool> node_rank_taken(static_cast<size_t>(n), false);
  result.reformed_with_the_survivors = true;
  result.reformed_nodes = -1;
  result.phantom_round_nodes = -1;
  for (int i = 0; i < n; ++i) {
    if (sim.dies[i]) continue;
    const RoundMembership& next = *sim.reformed_membership[i];
    if (result.reformed_nodes == -1) result.reformed_nodes = next.nodes;
    if (next.nodes != result.reformed_nodes || next.round != sim.reformed_membership[0]->round ||
        next.node_rank >= n || node_rank_taken[static_cast<size_t>(next.node_rank)]) {
      result.reformed_with_the_survivors = false;
    } else {
      node_rank_taken[static_cast<size_t>(next.node_rank)] = true;
    }
    const int phantom_round = sim.phantom_job_membership[i]->nodes;
    if (result.phantom_round_nodes == -1) result.phantom_round_nodes = phantom_round;
    result.phantom_was_member = result.phantom_was_member || phantom_round != survivors;
  }
  result.reformed_with_the_survivors = result.reformed_with_the_survivors && result.reformed_nodes == survivors;
}

}  // namespace

RendezvousBenchResult run_rendezvous_bench(const RendezvousBenchOptions& options) {
  TANDEM_CHECK(options.agents >= 2, "the simulation needs at least 2 agents, not ", options.agents);
  ensure_descriptors(options.agents);
  const int n = options.agents;
  const int dying = std::max(1, n / 100);
  Simulation sim(options);
  const std::chrono::milliseconds store_timeout = set_up_simulation(sim, options, dying);
  RendezvousBenchResult result;
  result.agents = n;
  result.died = dying;
  result.enter_traffic.resize(n);
  result.polls.resize(n);
  result.poll_traffic.resize(n);

  const auto start = Clock::now();
  std::vector<std::thread> threads;
  for (int index = 0; index < n; ++index) {
    threads.emplace_back([&sim, &result, index] {
      try {
        run_agent(sim, index, result);
      } catch (const std::exception& error) {
        sim.report([&] {
          if (sim.error.empty()) sim.error = fmt::format("agent {}: {}", index, first_line(error.what()));
        });
      }
    });
  }
  std::unique_ptr<Agent> phantom;
  try {
    drive_rendezvous_scenario(sim, store_timeout, result, phantom);
  } catch (...) {
    // Every agent stops at its next poll or tick; their store calls give up within the store timeout.
    sim.report([&] {
      if (sim.error.empty()) sim.error = "stopped";
    });
    for (auto& thread : threads) thread.join();
    throw;
  }
  for (auto& thread : threads) thread.join();
  collect_rendezvous_results(sim, start, n - dying, result);
  // The store host's agent goes last: it serves the others' connections.
  phantom.reset();
  for (int i = n - 1; i >= 0; --i) sim.agents[static_cast<size_t>(i)].reset();
  return result;
}

void print_rendezvous_table(const std::vector<RendezvousBenchResult>& results, const RendezvousBenchOptions& options) {
  const double interval = options.keep_alive_interval.count() / 1000.0;
  fmt::print("# simulated elastic agents (threads), one c10d TCPStore on loopback; keep-alive {:.1f} s x {}, last "
             "call {:.1f} s\n",
             interval, options.keep_alive_max_attempt, options.last_call.count() / 1000.0);
  fmt::print("# join: store operations per agent for enter() and its polls (every {} ms) until the round closed; "
             "tick: one agent's beat() and watch()\n",
             kAgentPoll.count());
  fmt::print("{:>7} {:>8} {:>9} {:>7} {:>9} {:>10} {:>10} {:>11} {:>9} {:>5} {:>9} {:>9} {:>8}\n", "agents", "form(s)",
             "join(ops)", "polls", "tick(ops)", "tick(B)", "ops/agt/s", "B/agent/s", "tick(s)", "died", "reform(s)",
             "next", "phantom");
  for (const RendezvousBenchResult& r : results) {
    std::vector<CallTraffic> joins(r.enter_traffic);
    for (size_t i = 0; i < joins.size(); ++i) add_to(joins[i], r.poll_traffic[i]);
    double polls = 0;
    for (int64_t p : r.polls) polls += static_cast<double>(p);
    fmt::print("{:>7} {:>8.2f} {:>9.1f} {:>7.1f} {:>9.1f} {:>10.0f} {:>10.1f} {:>11.0f} {:>9.3f} {:>5} {:>9.2f} {:>9} "
               "{:>8}\n",
               r.agents, r.form_seconds, mean_operations(joins), polls / static_cast<double>(r.polls.size()),
               mean_operations(r.tick_traffic), mean_bytes(r.tick_traffic),
               mean_operations(r.tick_traffic) / interval, mean_bytes(r.tick_traffic) / interval,
               r.longest_tick_seconds, r.died, r.reform_seconds,
               r.reformed_with_the_survivors ? fmt::format("{} ok", r.reformed_nodes)
                                             : fmt::format("{} WRONG", r.reformed_nodes),
               r.phantom_was_member ? "MEMBER" : "out");
  }
  for (const RendezvousBenchResult& r : results) {
    if (!r.early_end.empty()) fmt::print("# {} agents: the first round ended before any agent died: {}\n", r.agents, r.early_end);
  }
}

}  // namespace tandem::bench
