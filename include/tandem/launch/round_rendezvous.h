#pragma once
// How the agents of an elastic job (one `tandem run` per node) agree, over the job's c10d store, on who trains
// in each round, and how a round ends (docs/launcher.md, "Elastic jobs"). Life of an agent:
//
//   enter()                      check the job (finished? another job under this id?), take a slot in the
//                                newest round still open, else in the next one
//   poll_round() until it says   the round closes: with max_nodes live slots, or with at least min_nodes and
//   who is in                    no newcomer for last_call. Live: not given back (withdraw()) and not standing
//                                still, as seen by the closing agent; while it waits, each agent beats its slot
//                                in poll_round() every keep_alive_interval. An agent whose slot was not taken
//                                in moves on to the next round, as one waiting to join
//   withdraw()                   an agent that leaves while it waits (a signal, join_timeout) gives its slot back
//   beat(), watch() each         while the round's workers run: heartbeats; watch() reports the round's end,
//   keep_alive_interval          ending it first where a node's heartbeat stood still too long (a failure; a
//                                change where it never beat: that node never started) or an agent waits in the
//                                next round while this one has fewer than max_nodes and no node succeeded yet
//   end_round(...)               a worker failed, or all succeeded elsewhere: the first to end a round names why
//   next_round()                 take a slot in the round after
//
// Under in-job recovery (ElasticSettings::in_job_recovery) a running round outlives a lost node: watch() marks the
// node's place vacant instead of ending the round (unless it held rank 0), and take_vacated() tells the one agent
// that marked it, which reports the node's slots lost (in_job_recovery.h). An agent waiting to join takes a
// vacant place in the running round (poll_round returns it with `replacing`) and its workers start as
// replacements; the round does not grow otherwise. An agent that finds its own place vacated (the others took it
// for lost) ends its part of the round (RoundEnd::this_node_lost) and takes a place again as a newcomer.
//
// Every write that decides something (a slot, a round's members, its end, the job's signature) is one atomic add
// or compare_set, so two agents can never believe different things. A slot given back as its round closes is
// caught on one side or the other: withdraw() marks the slot before it reads whether the round closed, and the
// closing agent reads the marks before it writes the members, so either the closer leaves the slot out, or the
// members see the mark and end the round before it trains (a change of membership, no failure).
// Round numbers never repeat: they are the workers' TORCHELASTIC_RESTART_COUNT, whose keys live under
// /worker/attempt_<round>. Heartbeats are counters, judged by each watcher's own clock, so the nodes' clocks need
// not agree.
//
// Not thread-safe: the caller serialises the calls (elastic_agent.cpp holds a mutex). Store errors (a lost
// connection) come out as the store's own exceptions; InvalidArgument for a job this agent must not join.
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "tandem/launch/elastic_options.h"

namespace tandem::launch {

// This agent's place in a closed round.
struct RoundMembership {
  int round = 0;
  int node_rank = 0;        // the order of its slot among the round's nodes
  int nodes = 0;            // how many nodes the round closed with
  int failures_before = 0;  // rounds ended by a failure before this one (counted against --max-restarts)
  bool replacing = false;   // it takes a lost node's place in a running round (in-job recovery)
};

// Why a round ended. A failure (a worker failed, a node was lost) counts against --max-restarts; a change of
// membership (a node joining) does not, as in torchrun.
struct RoundEnd {
  bool failure = false;
  std::string reason;  // "node 1 (10.0.0.2, pid 312) was lost: no heartbeat for 3 s", ...
  // Ended by a node whose heartbeat stood still: its workers may still run until its agent, cut off, gives up on
  // the store, so the round after closes only settings.worker_stop_time after this end was seen.
  bool lost_node = false;
  // In-job recovery, seen by this agent alone: the others found this node lost and went on without it. It stops
  // its workers and takes a place again as a newcomer; the round goes on.
  bool this_node_lost = false;
};

class RoundRendezvous {
 public:
  using Clock = std::chrono::steady_clock;

  // `store`: the agents' own keys, a prefix of the job's store (elastic_agent.cpp). `node` names this agent in
  // others' messages ("10.0.0.2, pid 312"); `job_signature` is what every agent of the job must agree on (the
  // number of workers per node and the command).
  RoundRendezvous(c10::intrusive_ptr<c10d::Store> store, ElasticSettings settings, std::string node,
                  std::map<std::string, std::string> job_signature);

  // Checks the job and takes a slot in the newest open round (the next one when the newest is closed). Throws
  // InvalidArgument when the job has finished or its agents disagree with this one's signature.
  void enter(Clock::time_point now);
  // Takes a slot in the round after `membership` (or after the round last entered), once that one has ended.
  void next_round(Clock::time_point now);
  // Lets a new store connection stand in for the old one (after a lost connection), e.g. before enter().
  void reconnect(c10::intrusive_ptr<c10d::Store> store) { store_ = std::move(store); }

  // The round this agent waits in, once it has closed with this agent inside; nullopt while it is open (or when
  // it closed without this agent, which then waits in the next round, or when the job finished meanwhile:
  // job_finished()). Throws TimeoutError naming how many nodes came when fewer than min_nodes did within
  // join_timeout of enter(), after giving the slot back.
  std::optional<RoundMembership> poll_round(Clock::time_point now);
  // Every node of the job's last round succeeded while this agent waited to join: nothing is left to do.
  bool job_finished() const { return finished_; }
  // Gives this agent's slot back while it waits (it leaves: a signal, join_timeout, an error); where the round
  // closed with it inside already, ends that round as a change of membership, before anyone trains in it. A
  // member of a round that runs leaves through end_round() and leave() instead.
  void withdraw();
  // How many agents wait for the next round (for the agent's messages and the tests).
  int64_t waiting() const;

  // Adds to this agent's heartbeat in the running round.
  void beat();
  // The running round's end, if anyone ended it; else ends it where a node was lost (a failure) or an agent waits
  // to join while the round has fewer than max_nodes (a change), and returns that.
  std::optional<RoundEnd> watch(Clock::time_point now);
  // Ends the running round for `end` unless it ended already; returns the end that stands.
  RoundEnd end_round(const RoundEnd& end);
  // In-job recovery: the places this agent found vacated since the last call, and why ("node 2 (10.0.0.3, pid 9)
  // was lost: no heartbeat for 3.0 s"); every vacated place is told to one agent only.
  std::vector<std::pair<int, std::string>> take_vacated() { return std::exchange(vacated_, {}); }

  // The running round's workers on this node all exited 0; true once every node's did, and then the job is
  // done: marked in the store, so that every agent and a late one learn it.
  bool mark_succeeded();
  bool all_succeeded();
  // Says this agent leaves the job (it is done, or out of restarts); the hosting agent waits, bounded, until the
  // running round's nodes have all left and no agent waits to join (one that read the end gave its slot back)
  // before its store goes, so none of them mistakes the end for a lost store.
  void leave();
  int64_t left() const;

 private:
  std::string round_key(int round, const std::string& name) const;
  bool is_set(const std::string& key) const;
  std::string read(const std::string& key) const;
  void take_slot(int round, Clock::time_point now);
  void move_on(Clock::time_point now);
  bool previous_round_ended(Clock::time_point now);
  bool lost_node_stopped(Clock::time_point now) const;
  void beat_while_waiting(Clock::time_point now, int64_t joined);
  std::vector<int64_t> live_slots(Clock::time_point now, int64_t joined);
  bool stood_still(int64_t slot, Clock::time_point now) const;
  std::optional<RoundMembership> take_vacancy(Clock::time_point now);
  void read_places();
  void vacate(size_t node, int64_t slot, const std::string& why);
  int64_t vacancies_left() const;
  std::optional<RoundEnd> ended(int round) const;
  int failures_before(int round) const;
  void check_not_done() const;

  c10::intrusive_ptr<c10d::Store> store_;
  ElasticSettings settings_;
  std::string node_;
  std::map<std::string, std::string> signature_;

  // The round this agent waits in or runs in, its slot (1-based), and when it entered (for join_timeout).
  int round_ = 0;
  int64_t slot_ = 0;
  Clock::time_point entered_;
  // Closing below max_nodes: the slot count last seen and since when it stood still.
  int64_t joined_seen_ = -1;
  Clock::time_point joined_since_;
  std::optional<RoundMembership> membership_;
  std::vector<int64_t> member_slots_;  // the running round's members' slots, in node-rank order
  // In-job recovery: the slots the running round closed with, which places this agent knows vacant, how many
  // vacancies and fills it saw last (member_slots_ and vacant_ are read again when these move), the places it
  // vacated for take_vacated(), and since when, while waiting, it has seen a vacancy to take.
  std::vector<int64_t> closed_slots_;
  std::vector<bool> vacant_;
  int64_t changes_seen_ = -1;
  std::vector<std::pair<int, std::string>> vacated_;
  std::optional<Clock::time_point> vacancy_seen_;
  // Heartbeats of the running round's nodes, or of the slots waiting beside this one's (by slot): the count last
  // seen and since when it stood still.
  std::map<int64_t, std::pair<int64_t, Clock::time_point>> heartbeats_;
  // While waiting: when this agent last beat its slot and last looked at the others', the slots known given
  // back, and since when the previous round's end by a lost node was seen.
  std::optional<Clock::time_point> waiting_beat_;
  std::optional<Clock::time_point> waiting_looked_;
  std::set<int64_t> given_back_;
  std::optional<Clock::time_point> lost_end_seen_;
  bool finished_ = false;
};

}  // namespace tandem::launch
