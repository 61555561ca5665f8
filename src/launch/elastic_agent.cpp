#include "elastic_agent.h"

#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <algorithm>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>

#include "heartbeat_watch.h"
#include "in_job_recovery.h"
#include "job_signature.h"
#include "output_relay.h"
#include "supervisor.h"
#include "tandem/comm/membership.h"
#include "tandem/comm/rendezvous.h"
#include "tandem/launch/agent_store.h"
#include "tandem/launch/round_rendezvous.h"
#include "tandem/util/call_within.h"
#include "tandem/util/error.h"

namespace tandem::launch {
namespace {

using Clock = std::chrono::steady_clock;

// How often an agent looks at a round that is forming, and, once its own workers are done, at the others'.
constexpr std::chrono::milliseconds kAgentPoll{100};
// The shortest operation timeout of an agent's store connection: a loaded store host may take a while to answer.
constexpr std::chrono::milliseconds kMinStoreTimeout{1000};
// Beyond the store's own operation timeout, how long a call may take before the agent takes the store for lost.
constexpr std::chrono::milliseconds kStoreAnswerMargin{1000};
// Beyond --grace-period, how long a node's workers may take to be gone after SIGKILL (ElasticSettings::
// worker_stop_time); only a process stuck in uninterruptible I/O takes longer.
constexpr std::chrono::milliseconds kKilledGoneWithin{1000};
// How long the hosting agent keeps the store up, beyond the time a lost node takes to be noticed, for the other
// agents to read that the job is over.
constexpr std::chrono::seconds kHostLinger{2};

ElasticSettings settings_of(const LaunchPlan& plan) {
  ElasticSettings settings = *plan.elastic;
  settings.worker_stop_time = plan.grace_period + kKilledGoneWithin;
  settings.in_job_recovery = plan.recovery == Recovery::kInJob;
  return settings;
}

// A store that stops answering: the agent's calls give up after a bound and say so with this, which the agent
// handles as a lost store (it is no tandem::Error, as the store's own failures are none).
class StoreSilent : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// One connection to the job's store and the rounds spoken over it. Shared with every call under way: a call
// that never returns (LibTorch 2.x's store client waits for an answer without a deadline, so on a cut link it
// waits for ever) keeps the session it used alive and locked, and the agent goes on with a new session.
struct StoreSession {
  StoreSession(c10::intrusive_ptr<c10d::Store> keys, const ElasticSettings& settings, const std::string& node,
               const std::map<std::string, std::string>& signature)
      : rounds(std::move(keys), settings, node, signature) {}

  std::mutex mutex;  // one call at a time on the connection
  RoundRendezvous rounds;
};

class ElasticAgent {
 public:
  explicit ElasticAgent(const LaunchPlan& plan)
      : plan_(plan),
        settings_(settings_of(plan)),
        store_timeout_(std::max(settings_.heartbeat_lost_after(), kMinStoreTimeout)),
        // The Supervisor first: its signal handlers are in place while the store is being reached, so that a
        // Ctrl-C then ends the agent as it does later (interrupted_while), not by the signal's default death.
        supervisor_(plan.grace_period),
        store_(settings_, store_timeout_, [](const std::string& line) { report(line); },
               [this] { return signalled(); }),
        node_(describe_node(settings_.host)),
        signature_(job_signature(plan, settings_)) {
    if (store_.client()) start_session(store_.client());
  }

  int run() {
    if (!client_) return interrupted_while("waiting for the elastic job's store");
    enter();
    bool said_waiting = false;
    while (true) {
      std::optional<RoundMembership> membership;
      Clock::time_point polled_at;
      while (!membership) {
        bool finished = false;
        polled_at = Clock::now();
        try {
          std::tie(membership, finished) = on_store([now = polled_at](RoundRendezvous& rounds) {
            std::optional<RoundMembership> polled = rounds.poll_round(now);
            return std::make_pair(polled, rounds.job_finished());
          });
        } catch (const Error&) {
          throw;
        } catch (const std::exception& error) {
          if (std::optional<int> code = rejoin(first_line(error.what()))) return *code;
          continue;
        }
        if (finished) {
          report("the job finished while this node waited to join it: every node of its last round succeeded");
          return 0;
        }
        if (membership) break;
        if (!said_waiting) {
          report(fmt::format("waiting to join the elastic job '{}' ({} to {} nodes; up to join_timeout {:.0f} s)",
                             plan_.run_id, settings_.min_nodes, settings_.max_nodes,
                             settings_.join_timeout.count() / 1000.0));
          said_waiting = true;
        }
        if (supervisor_.wait_for_signal(kAgentPoll) != 0) {
          withdraw();
          return interrupted_while("waiting for a round");
        }
      }
      if (std::optional<int> code = run_round(*membership, polled_at)) return *code;
    }
  }

 private:
  void start_session(const c10::intrusive_ptr<c10d::Store>& client) {
    client_ = client;
    // The workers keep theirs under /worker/attempt_<round>; the agents', apart, cannot meet them.
    session_ = std::make_shared<StoreSession>(
        c10::make_intrusive<c10d::PrefixStore>("/tandem_agents/" + plan_.run_id, client), settings_, node_,
        signature_);
  }

  // Runs `operation` on the rounds of the current session and returns what it returns, or throws StoreSilent
  // when no answer came within the store timeout (or by `answer_by`, where that is sooner). `operation` is copied
  // to the thread that runs it, which may outlive this call (call_within): it must capture by value.
  template <typename Operation>
  auto on_store(Operation operation, std::optional<Clock::time_point> answer_by = std::nullopt)
      -> decltype(operation(std::declval<RoundRendezvous&>())) {
    const auto bound = Clock::now() + store_timeout_ + kStoreAnswerMargin;
    auto answered = call_within(std::min(bound, answer_by.value_or(bound)) - Clock::now(),
                                [session = session_, operation]() mutable {
                                  std::lock_guard<std::mutex> lock(session->mutex);
                                  return operation(session->rounds);
                                });
    if (!answered) {
      if (answer_by && *answer_by < bound) {
        throw StoreSilent(fmt::format("no heartbeat answered for {:.1f} s, the time after which the other nodes "
                                      "take this one for lost",
                                      settings_.heartbeat_lost_after().count() / 1000.0));
      }
      throw StoreSilent(fmt::format("it did not answer within {:.0f} s",
                                    (store_timeout_ + kStoreAnswerMargin).count() / 1000.0));
    }
    if constexpr (!std::is_void_v<decltype(operation(std::declval<RoundRendezvous&>()))>) return std::move(*answered);
  }

  // Whether a signal (Ctrl-C, SIGTERM, SIGHUP) came; once one did, always.
  bool signalled() { return supervisor_.wait_for_signal(std::chrono::milliseconds(0)) != 0; }

  // A signal before this node's workers started, or while none ran, ends the agent with 128 + the signal and one
  // line saying what it was doing.
  int interrupted_while(const std::string& doing) {
    report(fmt::format("received {} while {}; no worker was running", signal_name(supervisor_.signal_received()),
                       doing));
    return 128 + supervisor_.signal_received();
  }

  // Gives this agent's slot back as it leaves while waiting; a store that does not answer will drop the slot by
  // its standing heartbeat instead.
  void withdraw() {
    try {
      on_store([](RoundRendezvous& rounds) { rounds.withdraw(); });
    } catch (const Error&) {
      throw;
    } catch (const std::exception&) {
    }
  }

  // One store serves one job: the workers' keys (/worker/attempt_<round>) carry no job id, so a second job's
  // workers would meet the first's. Then takes a slot in the job's rounds.
  void enter() {
    const std::string id = plan_.run_id;
    const std::string served = on_store([client = client_, id, now = Clock::now()](RoundRendezvous& rounds) {
      const std::vector<uint8_t> wanted = comm::store_bytes(id);
      const std::vector<uint8_t> found = client->compareSet("/tandem_agents/job", {}, wanted);
      if (found == wanted) rounds.enter(now);
      return comm::store_text(found);
    });
    if (served != id) {
      throw InvalidArgument(fmt::format(
          "the store at {}:{} serves the elastic job '{}', not '{}'; give each job its own `rdzv_endpoint` port, or "
          "the same `run_id` on every node of one job",
          settings_.host, settings_.port, served, id));
    }
  }

  // Runs this node's workers for one round, which this agent found closed with it inside by a call sent at
  // `joined_at`; returns the agent's exit code once the job is over for it, or nothing when a next round follows.
  std::optional<int> run_round(const RoundMembership& membership, Clock::time_point joined_at) {
    LaunchPlan round_plan = plan_;
    round_plan.nnodes = membership.nodes;
    round_plan.node_rank = membership.node_rank;
    std::optional<RoundEnd> end;
    std::string store_error;
    int code_if_last = 1;
    const std::string here = fmt::format("on node {} ({})", membership.node_rank, node_);
    if (signalled()) {
      // Signalled as its round closed, before any worker started: a change of membership, as for a slot given
      // back, not a failure that would cost the others a restart.
      try {
        on_store([cause = fmt::format("node {} ({}) left before its round started", membership.node_rank, node_)](
                     RoundRendezvous& rounds) { rounds.end_round({false, cause}); });
      } catch (const Error&) {
        throw;
      } catch (const std::exception&) {
      }
      return interrupted_while("waiting for a round");
    }
    report(fmt::format("round {}: node {} of {}, ranks {}..{} of world size {}{}", membership.round,
                       membership.node_rank, membership.nodes, round_plan.global_rank(0),
                       round_plan.global_rank(plan_.nproc_per_node - 1), round_plan.world_size(),
                       membership.replacing ? ", in a lost node's place (in-job recovery)" : ""));
    std::map<std::string, std::string> store_variables{{"TORCHELASTIC_USE_AGENT_STORE", "True"}};
    if (membership.replacing) store_variables[comm::kReplacementVariable] = "1";
    // The workers' keys of this round, where in-job recovery's memberships are published.
    const comm::StorePtr attempt_keys = comm::attempt_keys(client_, membership.round);
    std::optional<InJobRecovery> recovery;
    if (plan_.recovery == Recovery::kInJob) {
      recovery.emplace(attempt_keys, round_plan.world_size(),
                       InJobRecovery::Place{round_plan.global_rank(0), plan_.nproc_per_node, store_.hosting()},
                       plan_.max_restarts - membership.failures_before, store_timeout_ + kStoreAnswerMargin);
    }
    {
      // A node cut off from the store stops its workers once no heartbeat was answered for as long as the others
      // wait before they take it for lost (heartbeat_watch.h), counted from the round's start. Under in-job
      // recovery, the agent that finds a node lost reports its slots to the agent deciding the memberships.
      HeartbeatWatch watch(
          [this, attempt_keys, nproc = plan_.nproc_per_node](Clock::time_point answer_by) {
            return on_store(
                [now = Clock::now(), attempt_keys, nproc](RoundRendezvous& rounds) {
                  rounds.beat();
                  std::optional<RoundEnd> end = rounds.watch(now);
                  for (const auto& [node, why] : rounds.take_vacated()) {
                    InJobRecovery::report_node_lost(attempt_keys, node * nproc, nproc);
                    report(why + "; the others go on without its workers (in-job recovery), and keep its place "
                                 "for a node that comes");
                  }
                  return end;
                },
                answer_by);
          },
          settings_.keep_alive_interval, settings_.heartbeat_lost_after(), joined_at);
      const AttemptEnd attempt = supervisor_.run_attempt(round_plan, membership.round, store_variables, watch.fd(),
                                                         recovery ? &*recovery : nullptr);
      const auto end_round = [&](const RoundEnd& cause) {
        try {
          end = on_store([cause](RoundRendezvous& rounds) { return rounds.end_round(cause); });
        } catch (const Error&) {
          throw;
        } catch (const std::exception& error) {
          store_error = first_line(error.what());
        }
      };
      switch (attempt.kind) {
        case AttemptEnd::Kind::kSucceeded:
          if (std::optional<int> code = wait_for_the_others(watch, membership, store_error)) return code;
          break;
        case AttemptEnd::Kind::kFailed:
          end_round({true, fmt::format("rank {} {} {}", attempt.failure.rank, attempt.failure.describe(), here)});
          code_if_last = attempt.failure.shell_code();
          break;
        case AttemptEnd::Kind::kNotRun:
        case AttemptEnd::Kind::kSignalled:
          // Neither is a failure a restart can mend: this agent leaves, and the others go on without it.
          end_round({true, attempt.kind == AttemptEnd::Kind::kNotRun
                               ? fmt::format("node {} cannot start its workers", membership.node_rank)
                               : fmt::format("the agent {} received {}", here, signal_name(attempt.signal))});
          report(describe_end(attempt));
          return leave(membership, exit_code_of(attempt));
        case AttemptEnd::Kind::kStopped:
          break;
      }
      if (!end && store_error.empty() && watch.finished()) {
        end = watch.ended();
        store_error = watch.store_error();
      }
    }
    if (!end) return rejoin(store_error.empty() ? "it stopped answering" : store_error);
    return after_round(membership, *end, code_if_last);
  }

  // The round ended (`end`): this agent leaves once restarts are used up, with `code_if_last`; else it takes a
  // slot in the next round. Returns the agent's exit code, or nothing when a next round follows.
  std::optional<int> after_round(const RoundMembership& membership, const RoundEnd& end, int code_if_last) {
    const int failures = membership.failures_before + (end.failure ? 1 : 0);
    if (end.failure && failures > plan_.max_restarts) {
      report(end.reason + (plan_.max_restarts > 0 ? fmt::format("; all {} restart(s) used up", plan_.max_restarts)
                                                  : "; stopped this node's workers (no restart allowed)"));
      return leave(membership, code_if_last);
    }
    // A node the others went on without (in-job recovery) says why in full; the round goes on without it.
    report(end.reason + (end.this_node_lost ? ""
                         : end.failure      ? fmt::format("; restarting the workers of every node in a new round "
                                                          "(restart {} of {})",
                                                          failures, plan_.max_restarts)
                                            : "; forming a new round with it (a node joining is no restart)"));
    try {
      on_store([now = Clock::now()](RoundRendezvous& rounds) { rounds.next_round(now); });
    } catch (const Error&) {
      throw;
    } catch (const std::exception& error) {
      return rejoin(first_line(error.what()));
    }
    return std::nullopt;
  }

  // This node's workers all exited 0: the job is done once every node's did. Meanwhile the watch keeps beating,
  // and a round that ends (a node lost) still restarts these workers with the others.
  std::optional<int> wait_for_the_others(const HeartbeatWatch& watch, const RoundMembership& membership,
                                         std::string& store_error) {
    bool marked = false;
    while (!watch.finished()) {
      bool all = false;
      try {
        all = on_store([marked](RoundRendezvous& rounds) {
          return marked ? rounds.all_succeeded() : rounds.mark_succeeded();
        });
        marked = true;
      } catch (const Error&) {
        throw;
      } catch (const std::exception& error) {
        store_error = first_line(error.what());
        return std::nullopt;
      }
      if (all) return leave(membership, 0);
      if (supervisor_.wait_for_signal(kAgentPoll) != 0) {
        report(fmt::format("received {} after this node's workers had finished",
                           signal_name(supervisor_.signal_received())));
        return leave(membership, 128 + supervisor_.signal_received());
      }
    }
    return std::nullopt;
  }

  // Says so in the store and, where this agent serves it, keeps it up (bounded) until the round's other agents
  // have said so too and every agent waiting to join has read the end: one that found the store gone would take
  // the end for a lost link.
  int leave(const RoundMembership& membership, int code) {
    try {
      on_store([](RoundRendezvous& rounds) { rounds.leave(); });
      const auto until = Clock::now() + settings_.heartbeat_lost_after() + kHostLinger;
      const auto someone_untold = [nodes = membership.nodes](RoundRendezvous& rounds) {
        return rounds.left() < nodes || rounds.waiting() > 0;
      };
      while (store_.hosting() && Clock::now() < until && on_store(someone_untold)) {
        std::this_thread::sleep_for(kAgentPoll);
      }
    } catch (const Error&) {
      throw;
    } catch (const std::exception&) {
      // The store is gone already: nobody is left to tell.
    }
    return code;
  }

  // The store stopped answering (this node's link was cut, or the store host is gone): the workers are
  // stopped by now; try to get back into the job until join_timeout, as a newcomer, over a new connection.
  // Returns nothing once back in, or the agent's exit code when a signal (Ctrl-C) ended the wait. Throws
  // CommError once join_timeout has passed.
  std::optional<int> rejoin(const std::string& why) {
    report(fmt::format("lost the job's store at {}:{} ({}); stopped this node's workers, trying to rejoin for up to "
                       "{:.0f} s",
                       settings_.host, settings_.port, why, settings_.join_timeout.count() / 1000.0));
    const auto deadline = Clock::now() + settings_.join_timeout;
    while (true) {
      c10::intrusive_ptr<c10d::Store> client = store_.reconnect(deadline, [this] { return signalled(); });
      if (!client) return interrupted_while("trying to rejoin");
      start_session(client);
      try {
        enter();
        return std::nullopt;
      } catch (const Error&) {
        throw;
      } catch (const std::exception& error) {
        // Lost again while entering: try once more, within the same deadline. The store host's reconnect returns
        // its own store at once, so the deadline is checked here too, or a host whose entry keeps failing would
        // try for ever.
        if (Clock::now() >= deadline) {
          throw CommError(fmt::format("could not rejoin the elastic job at {}:{} within join_timeout {:.0f} s ({}); "
                                      "start this node again once the job's store answers",
                                      settings_.host, settings_.port, settings_.join_timeout.count() / 1000.0,
                                      first_line(error.what())));
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    }
  }

  const LaunchPlan& plan_;
  ElasticSettings settings_;
  std::chrono::milliseconds store_timeout_;
  Supervisor supervisor_;
  AgentStore store_;
  std::string node_;
  std::map<std::string, std::string> signature_;
  c10::intrusive_ptr<c10d::Store> client_;  // the session's connection, unprefixed
  std::shared_ptr<StoreSession> session_;
};

}  // namespace

int run_elastic_agent(const LaunchPlan& plan) {
  ElasticAgent agent(plan);
  return agent.run();
}

}  // namespace tandem::launch
