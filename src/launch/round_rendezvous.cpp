#include "tandem/launch/round_rendezvous.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <sstream>

#include "tandem/comm/rendezvous.h"
#include "tandem/util/error.h"

namespace tandem::launch {
namespace {

double seconds_of(std::chrono::milliseconds duration) { return duration.count() / 1000.0; }

// A round's end as stored: "F" (a failure) or "C" (a change of membership), "L" where a node was lost or "-",
// then "|reason".
std::string encode_end(const RoundEnd& end) {
  return std::string(end.failure ? "F" : "C") + (end.lost_node ? "L|" : "-|") + end.reason;
}
RoundEnd decode_end(const std::string& text) {
  RoundEnd end;
  end.failure = text.rfind('F', 0) == 0;
  end.lost_node = text.size() > 1 && text[1] == 'L';
  end.reason = text.substr(std::min<size_t>(3, text.size()));
  return end;
}

// A closed round as stored: "FAILURES GIVEN_BACK SLOT,SLOT,...": the rounds ended by a failure before it, how
// many slots had been given back when the closing agent looked, and the members' slots in node-rank order.
struct ClosedRound {
  int failures = 0;
  int64_t given_back = 0;
  std::vector<int64_t> slots;
};

std::string encode_closed(const ClosedRound& closed) {
  return fmt::format("{} {} {}", closed.failures, closed.given_back, fmt::join(closed.slots, ","));
}

ClosedRound decode_closed(const std::string& text) {
  ClosedRound closed;
  std::istringstream in(text);
  std::string slots;
  in >> closed.failures >> closed.given_back >> slots;
  std::istringstream list(slots);
  for (std::string slot; std::getline(list, slot, ',');) closed.slots.push_back(std::stoll(slot));
  return closed;
}

// A running round's places under in-job recovery (round_key): who holds a place now ("holder/NODE", absent while
// the slot it closed with does), whether that holder was found lost ("vacated/NODE/SLOT", set once, to the slot of
// the agent that found it), and who took it then ("filled/NODE/SLOT"). The counts tell watchers when to read again.
std::string holder_name(size_t node) { return fmt::format("holder/{}", node); }
std::string vacated_name(size_t node, int64_t slot) { return fmt::format("vacated/{}/{}", node, slot); }
std::string filled_name(size_t node, int64_t slot) { return fmt::format("filled/{}/{}", node, slot); }
const std::string kVacancies = "vacancies";
const std::string kFills = "fills";

// The jobs' keys, under the agents' prefix.
const std::string kDoneKey = "done";
// The newest round known to have closed: where enter() starts looking. Only ever set after that round closed,
// so it never points past an open round.
const std::string kLastClosedKey = "rounds/last_closed";

}  // namespace

RoundRendezvous::RoundRendezvous(c10::intrusive_ptr<c10d::Store> store, ElasticSettings settings, std::string node,
                                 std::map<std::string, std::string> job_signature)
    : store_(std::move(store)), settings_(std::move(settings)), node_(std::move(node)),
      signature_(std::move(job_signature)) {}

std::string RoundRendezvous::round_key(int round, const std::string& name) const {
  return fmt::format("round/{}/{}", round, name);
}

bool RoundRendezvous::is_set(const std::string& key) const { return store_->check({key}); }

std::string RoundRendezvous::read(const std::string& key) const { return comm::store_text(store_->get(key)); }

void RoundRendezvous::check_not_done() const {
  if (is_set(kDoneKey)) {
    throw InvalidArgument("this job has finished: every worker of its last round exited 0; start a new job with "
                          "a `run_id` of its own");
  }
}

void RoundRendezvous::enter(Clock::time_point now) {
  check_not_done();
  for (const auto& [what, value] : signature_) {
    const std::string stored = comm::store_text(store_->compareSet("job/" + what, {}, comm::store_bytes(value)));
    if (stored != value) {
      // Commands can be long: the line shows each around where the two part.
      size_t parting = 0;
      while (parting < value.size() && parting < stored.size() && value[parting] == stored[parting]) ++parting;
      const size_t from = parting > 20 ? parting - 20 : 0;
      const auto shown = [from](const std::string& text) {
        return (from > 0 ? "..." : "") + text.substr(from, 40) + (text.size() > from + 40 ? "..." : "");
      };
      throw InvalidArgument(fmt::format(
          "this node's {} is {}, but the job's other nodes have {}: every node of an elastic job must give the same "
          "`nnodes`, `max_restarts`, `grace_period`, `rdzv_conf` timings, `nproc_per_node`, `recovery` and command; "
          "give the "
          "same flags on every node, or a job of its own a `run_id` of its own",
          what, shown(value), shown(stored)));
    }
  }
  int round = is_set(kLastClosedKey) ? std::stoi(read(kLastClosedKey)) : 0;
  while (is_set(round_key(round, "closed"))) ++round;
  entered_ = now;
  take_slot(round, now);
}

void RoundRendezvous::next_round(Clock::time_point now) {
  entered_ = now;
  move_on(now);
}

// The first round after this one that has not closed: a round formed without this agent (it was slow to stop
// its workers, or was left out) runs on; wait in the one after.
void RoundRendezvous::move_on(Clock::time_point now) {
  int round = round_ + 1;
  while (is_set(round_key(round, "closed"))) ++round;
  take_slot(round, now);
}

void RoundRendezvous::take_slot(int round, Clock::time_point now) {
  round_ = round;
  slot_ = store_->add(round_key(round, "joined"), 1);
  store_->set(round_key(round, fmt::format("member/{}", slot_)), comm::store_bytes(node_));
  joined_seen_ = slot_;
  joined_since_ = now;
  membership_.reset();
  heartbeats_.clear();
  waiting_beat_.reset();
  waiting_looked_.reset();
  given_back_.clear();
  lost_end_seen_.reset();
  vacancy_seen_.reset();
}

std::optional<RoundEnd> RoundRendezvous::ended(int round) const {
  const std::string key = round_key(round, "ended");
  if (!is_set(key)) return std::nullopt;
  return decode_end(read(key));
}

int RoundRendezvous::failures_before(int round) const {
  if (round == 0 || !is_set(round_key(round - 1, "closed"))) return 0;
  const int before = decode_closed(read(round_key(round - 1, "closed"))).failures;
  const auto end = ended(round - 1);
  return before + (end && end->failure ? 1 : 0);
}

// A round after another closes only once that one has ended (there was none: ended), else the newcomer would
// train beside it. Notes when an end by a lost node was first seen, for lost_node_stopped().
bool RoundRendezvous::previous_round_ended(Clock::time_point now) {
  if (round_ == 0 || !is_set(round_key(round_ - 1, "closed"))) return true;
  const auto end = ended(round_ - 1);
  if (end && end->lost_node && !lost_end_seen_) lost_end_seen_ = now;
  return end.has_value();
}

// After a node's loss, the round waits until the lost node's workers are certainly stopped
// (ElasticSettings::worker_stop_time from the loss).
bool RoundRendezvous::lost_node_stopped(Clock::time_point now) const {
  return !lost_end_seen_ || now - *lost_end_seen_ >= settings_.worker_stop_time;
}

// While it waits, this agent beats its slot and looks at the others' every keep_alive_interval, so that a slot
// whose agent died or hangs in a store call is left out when the round closes.
void RoundRendezvous::beat_while_waiting(Clock::time_point now, int64_t joined) {
  if (!waiting_beat_ || now - *waiting_beat_ >= settings_.keep_alive_interval) {
    store_->add(round_key(round_, fmt::format("alive/{}", slot_)), 1);
    waiting_beat_ = now;
  }
  if (waiting_looked_ && now - *waiting_looked_ < settings_.keep_alive_interval) return;
  waiting_looked_ = now;
  for (int64_t slot = 1; slot <= joined; ++slot) {
    if (slot == slot_ || given_back_.count(slot) != 0) continue;
    const int64_t count = store_->add(round_key(round_, fmt::format("alive/{}", slot)), 0);
    auto [entry, inserted] = heartbeats_.emplace(slot, std::make_pair(count, now));
    if (!inserted && entry->second.first != count) entry->second = {count, now};
  }
}

bool RoundRendezvous::stood_still(int64_t slot, Clock::time_point now) const {
  const auto found = heartbeats_.find(slot);
  return found != heartbeats_.end() && now - found->second.second >= settings_.heartbeat_lost_after();
}

// The slots that may still become members: not given back, and not standing still as far as this agent saw.
std::vector<int64_t> RoundRendezvous::live_slots(Clock::time_point now, int64_t joined) {
  const int64_t given_back = store_->add(round_key(round_, "given_back"), 0);
  if (given_back > static_cast<int64_t>(given_back_.size())) {
    for (int64_t slot = 1; slot <= joined; ++slot) {
      if (is_set(round_key(round_, fmt::format("gone/{}", slot)))) given_back_.insert(slot);
    }
  }
  std::vector<int64_t> live;
  for (int64_t slot = 1; slot <= joined; ++slot) {
    if (given_back_.count(slot) == 0 && (slot == slot_ || !stood_still(slot, now))) live.push_back(slot);
  }
  return live;
}

std::optional<RoundMembership> RoundRendezvous::poll_round(Clock::time_point now) {
  if (is_set(kDoneKey)) {
    // The slot given back says "told": the hosting agent keeps the store up until no slot waits (leave()).
    withdraw();
    finished_ = true;
    return std::nullopt;
  }
  const std::string closed_key = round_key(round_, "closed");
  if (is_set(closed_key)) {
    const ClosedRound closed = decode_closed(read(closed_key));
    const auto mine = std::find(closed.slots.begin(), closed.slots.end(), slot_);
    if (mine == closed.slots.end()) {
      // Too late for this round, or left out: wait in the next, which the running agents notice (watch()).
      move_on(now);
      return std::nullopt;
    }
    // A member that gave its slot back after the closing agent looked: the round ends before anyone trains.
    if (store_->add(round_key(round_, "given_back"), 0) > closed.given_back) {
      for (size_t node = 0; node < closed.slots.size(); ++node) {
        const int64_t slot = closed.slots[node];
        if (!is_set(round_key(round_, fmt::format("gone/{}", slot)))) continue;
        end_round({false, fmt::format("node {} ({}) left before its round started", node,
                                      read(round_key(round_, fmt::format("member/{}", slot))))});
        move_on(now);
        return std::nullopt;
      }
    }
    membership_ = RoundMembership{round_, static_cast<int>(mine - closed.slots.begin()),
                                  static_cast<int>(closed.slots.size()), closed.failures};
    member_slots_ = closed_slots_ = closed.slots;
    vacant_.assign(closed.slots.size(), false);
    changes_seen_ = -1;
    heartbeats_.clear();
    return membership_;
  }
  if (settings_.in_job_recovery) {
    if (std::optional<RoundMembership> taken = take_vacancy(now)) return taken;
  }
  const int64_t joined = store_->add(round_key(round_, "joined"), 0);
  if (joined != joined_seen_) {
    joined_seen_ = joined;
    joined_since_ = now;
  }
  beat_while_waiting(now, joined);
  // The last call counts from the previous round's end, when the running agents come over.
  const bool previous_ended = previous_round_ended(now);
  if (!previous_ended) joined_since_ = std::max(joined_since_, now);
  if (previous_ended && lost_node_stopped(now) && joined >= settings_.min_nodes) {
    // The marks of given-back slots are read before the members are written (see the header).
    ClosedRound closed{failures_before(round_), store_->add(round_key(round_, "given_back"), 0), {}};
    closed.slots = live_slots(now, joined);
    const auto live = static_cast<int64_t>(closed.slots.size());
    const bool full = live >= settings_.max_nodes;
    const bool last_call_over = live >= settings_.min_nodes && now - joined_since_ >= settings_.last_call;
    if (full || last_call_over) {
      closed.slots.resize(static_cast<size_t>(std::min<int64_t>(live, settings_.max_nodes)));
      store_->compareSet(closed_key, {}, comm::store_bytes(encode_closed(closed)));
      store_->set(kLastClosedKey, comm::store_bytes(std::to_string(round_)));
      return poll_round(now);
    }
  }
  if (now - entered_ >= settings_.join_timeout) {
    const size_t came = live_slots(now, joined).size();
    withdraw();
    if (!previous_ended && settings_.in_job_recovery) {
      throw TimeoutError(fmt::format(
          "waited {:.0f} s to join the elastic job, whose running round (in-job recovery) takes a newcomer only in a "
          "lost node's place, and lost none; start this node when one of them is gone",
          seconds_of(settings_.join_timeout)));
    }
    if (!previous_ended) {
      throw TimeoutError(fmt::format(
          "waited {:.0f} s to join the elastic job, which runs on its most nodes ({}) and took no newcomer; "
          "start this node when one of them is gone, or raise the most nodes of `nnodes`",
          seconds_of(settings_.join_timeout), settings_.max_nodes));
    }
    throw TimeoutError(fmt::format(
        "waited {:.0f} s for the elastic job's least number of nodes ({}), but {} came; start the other nodes' "
        "tandem run with the same `rdzv_endpoint` and `run_id`, or raise join_timeout in `rdzv_conf`",
        seconds_of(settings_.join_timeout), settings_.min_nodes, came));
  }
  return std::nullopt;
}

void RoundRendezvous::withdraw() {
  if (membership_ || slot_ == 0) return;
  // The mark, then the count, then the look at the round: the order the header's argument needs.
  store_->set(round_key(round_, fmt::format("gone/{}", slot_)), comm::store_bytes("1"));
  store_->add(round_key(round_, "given_back"), 1);
  const std::string closed_key = round_key(round_, "closed");
  if (!is_set(closed_key)) return;
  const ClosedRound closed = decode_closed(read(closed_key));
  const auto mine = std::find(closed.slots.begin(), closed.slots.end(), slot_);
  if (mine == closed.slots.end()) return;
  end_round({false, fmt::format("node {} ({}) left before its round started", mine - closed.slots.begin(), node_)});
}

int64_t RoundRendezvous::waiting() const {
  return store_->add(round_key(round_ + 1, "joined"), 0) - store_->add(round_key(round_ + 1, "given_back"), 0);
}

void RoundRendezvous::beat() { store_->add(round_key(round_, fmt::format("beat/{}", slot_)), 1); }

std::optional<RoundEnd> RoundRendezvous::watch(Clock::time_point now) {
  if (auto end = ended(round_)) return end;
  const int nodes = membership_ ? membership_->nodes : 0;
  if (settings_.in_job_recovery && membership_) {
    read_places();
    if (vacant_[static_cast<size_t>(membership_->node_rank)]) {
      RoundEnd end{false,
                   fmt::format("the other nodes took node {} ({}) for lost (no heartbeat for {:.1f} s) and went on "
                               "without it; stopped its workers, taking a place in the job again",
                               membership_->node_rank, node_, seconds_of(settings_.heartbeat_lost_after()))};
      end.this_node_lost = true;
      return end;
    }
  }
  for (size_t node = 0; node < member_slots_.size(); ++node) {
    const int64_t slot = member_slots_[node];
    if (slot == slot_ || (settings_.in_job_recovery && vacant_[node])) continue;
    const int64_t count = store_->add(round_key(round_, fmt::format("beat/{}", slot)), 0);
    auto [entry, inserted] = heartbeats_.emplace(slot, std::make_pair(count, now));
    if (!inserted && entry->second.first != count) entry->second = {count, now};
    const auto still = now - entry->second.second;
    if (still >= settings_.heartbeat_lost_after()) {
      const std::string member = read(round_key(round_, fmt::format("member/{}", slot)));
      // A node that never beat never started its workers' round (its agent died, or hung in a store call, as
      // the round closed): a change of membership. One that beat and stopped was lost while training: a failure.
      const bool trained = count > 0;
      // Under in-job recovery the others go on without it, unless it held rank 0 (the run's records). Once a
      // node succeeded the run is over, and the nodes stop beating as they leave: nobody is lost then.
      if (settings_.in_job_recovery && node > 0) {
        if (store_->add(round_key(round_, "succeeded"), 0) == 0) {
          vacate(node, slot,
                 fmt::format("node {} ({}) was lost: no heartbeat for {:.1f} s", node, member,
                             seconds_of(settings_.heartbeat_lost_after())));
        }
        continue;
      }
      return end_round({trained,
                        fmt::format("node {} ({}) {}: no heartbeat for {:.1f} s", node, member,
                                    trained ? "was lost" : "never started its round",
                                    seconds_of(settings_.heartbeat_lost_after())),
                        /*lost_node=*/true});
    }
  }
  // Once a node's workers all succeeded, the job is ending: a newcomer waits for that instead of restarting it.
  // Under in-job recovery a newcomer takes a lost node's place instead (poll_round).
  if (!settings_.in_job_recovery && nodes < settings_.max_nodes && waiting() > 0 &&
      store_->add(round_key(round_, "succeeded"), 0) == 0) {
    return end_round({false, fmt::format("a node is waiting to join the {} running", nodes)});
  }
  return std::nullopt;
}

// Who holds each place of the running round, and which are vacant: read again only when a vacancy or a fill
// was counted since the last look (two reads a watch otherwise).
void RoundRendezvous::read_places() {
  const int64_t changes = store_->add(round_key(round_, kVacancies), 0) + store_->add(round_key(round_, kFills), 0);
  if (changes == changes_seen_) return;
  changes_seen_ = changes;
  for (size_t node = 0; node < closed_slots_.size(); ++node) {
    const std::string holder = round_key(round_, holder_name(node));
    member_slots_[node] = is_set(holder) ? std::stoll(read(holder)) : closed_slots_[node];
    vacant_[node] = is_set(round_key(round_, vacated_name(node, member_slots_[node])));
  }
}

// Marks `node`'s place vacant, its holder `slot` lost; the agent whose mark stands reports it (take_vacated).
void RoundRendezvous::vacate(size_t node, int64_t slot, const std::string& why) {
  const std::vector<uint8_t> mine = comm::store_bytes(std::to_string(slot_));
  if (store_->compareSet(round_key(round_, vacated_name(node, slot)), {}, mine) == mine) {
    store_->add(round_key(round_, kVacancies), 1);
    vacated_.emplace_back(static_cast<int>(node), why);
  }
  vacant_[node] = true;
}

int64_t RoundRendezvous::vacancies_left() const {
  if (!settings_.in_job_recovery) return 0;
  return store_->add(round_key(round_, kVacancies), 0) - store_->add(round_key(round_, kFills), 0);
}

// Waiting to join while the round before runs under in-job recovery: takes a vacant place in it, once the lost
// node's workers are certainly stopped (ElasticSettings::worker_stop_time after this agent saw the vacancy). This
// agent's slot in the round it waited in is given back.
std::optional<RoundMembership> RoundRendezvous::take_vacancy(Clock::time_point now) {
  if (round_ == 0) return std::nullopt;
  const int running = round_ - 1;
  if (!is_set(round_key(running, "closed")) || ended(running)) return std::nullopt;
  const auto count = [&](const std::string& name) { return store_->add(round_key(running, name), 0); };
  if (count(kVacancies) == count(kFills)) {
    vacancy_seen_.reset();
    return std::nullopt;
  }
  if (!vacancy_seen_) vacancy_seen_ = now;
  if (now - *vacancy_seen_ < settings_.worker_stop_time) return std::nullopt;
  const ClosedRound closed = decode_closed(read(round_key(running, "closed")));
  for (size_t node = 0; node < closed.slots.size(); ++node) {
    const std::string holder_key = round_key(running, holder_name(node));
    const int64_t holder = is_set(holder_key) ? std::stoll(read(holder_key)) : closed.slots[node];
    if (!is_set(round_key(running, vacated_name(node, holder)))) continue;
    // A slot of the running round's own, so that its heartbeat starts afresh in the others' eyes.
    const int64_t slot = store_->add(round_key(running, "joined"), 1);
    store_->set(round_key(running, fmt::format("member/{}", slot)), comm::store_bytes(node_));
    const std::vector<uint8_t> mine = comm::store_bytes(std::to_string(slot));
    if (store_->compareSet(round_key(running, filled_name(node, holder)), {}, mine) != mine) continue;
    store_->set(holder_key, mine);
    store_->add(round_key(running, kFills), 1);
    store_->set(round_key(round_, fmt::format("gone/{}", slot_)), comm::store_bytes("1"));
    store_->add(round_key(round_, "given_back"), 1);
    round_ = running;
    slot_ = slot;
    membership_ = RoundMembership{running, static_cast<int>(node), static_cast<int>(closed.slots.size()),
                                  closed.failures, /*replacing=*/true};
    member_slots_ = closed_slots_ = closed.slots;
    vacant_.assign(closed.slots.size(), false);
    changes_seen_ = -1;
    heartbeats_.clear();
    read_places();
    return membership_;
  }
  return std::nullopt;
}

RoundEnd RoundRendezvous::end_round(const RoundEnd& end) {
  return decode_end(comm::store_text(store_->compareSet(round_key(round_, "ended"), {}, comm::store_bytes(encode_end(end)))));
}

bool RoundRendezvous::mark_succeeded() {
  store_->add(round_key(round_, "succeeded"), 1);
  return all_succeeded();
}

bool RoundRendezvous::all_succeeded() {
  const int nodes = membership_ ? membership_->nodes : 0;
  // A place left vacant has nobody to succeed in it.
  if (store_->add(round_key(round_, "succeeded"), 0) < nodes - vacancies_left()) return false;
  store_->compareSet(kDoneKey, {}, comm::store_bytes("1"));
  return true;
}

void RoundRendezvous::leave() { store_->add(round_key(round_, "left"), 1); }

int64_t RoundRendezvous::left() const { return store_->add(round_key(round_, "left"), 0); }

}  // namespace tandem::launch
