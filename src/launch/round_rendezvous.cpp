#include "tandem/launch/round_rendezvous.h"

#include <fmt/format.h>

#include <algorithm>

#include "tandem/util/error.h"

namespace tandem::launch {
namespace {

std::vector<uint8_t> bytes_of(const std::string& text) { return {text.begin(), text.end()}; }
std::string text_of(const std::vector<uint8_t>& bytes) { return {bytes.begin(), bytes.end()}; }

double seconds_of(std::chrono::milliseconds duration) { return duration.count() / 1000.0; }

// A round's end as stored: "F|reason" (a failure) or "C|reason" (a change of membership).
std::string encode_end(const RoundEnd& end) { return (end.failure ? "F|" : "C|") + end.reason; }
RoundEnd decode_end(const std::string& text) { return {text.rfind("F|", 0) == 0, text.substr(std::min<size_t>(2, text.size()))}; }

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

std::string RoundRendezvous::read(const std::string& key) const { return text_of(store_->get(key)); }

void RoundRendezvous::check_not_done() const {
  if (is_set(kDoneKey)) {
    throw InvalidArgument("this job has finished: every worker of its last round exited 0; start a new job with "
                          "a `run_id` of its own");
  }
}

void RoundRendezvous::enter(Clock::time_point now) {
  check_not_done();
  for (const auto& [what, value] : signature_) {
    const std::string stored = text_of(store_->compareSet("job/" + what, {}, bytes_of(value)));
    if (stored != value) {
      // Commands can be long: the line shows each around where the two part.
      size_t parting = 0;
      while (parting < value.size() && parting < stored.size() && value[parting] == stored[parting]) ++parting;
      const size_t from = parting > 20 ? parting - 20 : 0;
      const auto shown = [from](const std::string& text) {
        return (from > 0 ? "..." : "") + text.substr(from, 40) + (text.size() > from + 40 ? "..." : "");
      };
      throw InvalidArgument(fmt::format(
          "this node's {} is {}, but the job's other nodes run {}: every node of an elastic job must run the same "
          "workers; give the same flags on every node, or a job of its own a `run_id` of its own",
          what, shown(value), shown(stored)));
    }
  }
  int round = is_set(kLastClosedKey) ? std::stoi(read(kLastClosedKey)) : 0;
  while (is_set(round_key(round, "closed"))) ++round;
  entered_ = now;
  take_slot(round, now);
}

void RoundRendezvous::next_round(Clock::time_point now) {
  int round = round_ + 1;
  // A round formed without this agent (it was slow to stop its workers) runs on; wait in the one after.
  while (is_set(round_key(round, "closed"))) ++round;
  entered_ = now;
  take_slot(round, now);
}

void RoundRendezvous::take_slot(int round, Clock::time_point now) {
  round_ = round;
  slot_ = store_->add(round_key(round, "joined"), 1);
  store_->set(round_key(round, fmt::format("member/{}", slot_)), bytes_of(node_));
  joined_seen_ = slot_;
  joined_since_ = now;
  membership_.reset();
  heartbeats_.clear();
}

std::optional<RoundEnd> RoundRendezvous::ended(int round) const {
  const std::string key = round_key(round, "ended");
  if (!is_set(key)) return std::nullopt;
  return decode_end(read(key));
}

int RoundRendezvous::failures_before(int round) const {
  if (round == 0 || !is_set(round_key(round - 1, "closed"))) return 0;
  const std::string closed = read(round_key(round - 1, "closed"));
  const int before = std::stoi(closed.substr(closed.find(' ') + 1));
  const auto end = ended(round - 1);
  return before + (end && end->failure ? 1 : 0);
}

std::optional<RoundMembership> RoundRendezvous::poll_round(Clock::time_point now) {
  check_not_done();
  const std::string closed_key = round_key(round_, "closed");
  if (is_set(closed_key)) {
    const std::string closed = read(closed_key);
    const int nodes = std::stoi(closed.substr(0, closed.find(' ')));
    const int failures = std::stoi(closed.substr(closed.find(' ') + 1));
    if (slot_ <= nodes) {
      membership_ = RoundMembership{round_, static_cast<int>(slot_ - 1), nodes, failures};
      heartbeats_.clear();
      return membership_;
    }
    // Too late for this round: wait in the next, which the running agents notice (watch()).
    take_slot(round_ + 1, now);
    return std::nullopt;
  }
  const int64_t joined = store_->add(round_key(round_, "joined"), 0);
  if (joined != joined_seen_) {
    joined_seen_ = joined;
    joined_since_ = now;
  }
  // A round after another closes only once that one has ended, else the newcomer would train beside it; the
  // last call counts from that end, when the running agents come over.
  const bool previous_over = round_ == 0 || !is_set(round_key(round_ - 1, "closed")) || ended(round_ - 1).has_value();
  if (!previous_over) joined_since_ = std::max(joined_since_, now);
  const bool full = joined >= settings_.max_nodes;
  const bool last_call_over = joined >= settings_.min_nodes && now - joined_since_ >= settings_.last_call;
  if (previous_over && (full || last_call_over)) {
    const int nodes = static_cast<int>(std::min<int64_t>(joined, settings_.max_nodes));
    store_->compareSet(closed_key, {}, bytes_of(fmt::format("{} {}", nodes, failures_before(round_))));
    store_->set(kLastClosedKey, bytes_of(std::to_string(round_)));
    return poll_round(now);
  }
  if (now - entered_ >= settings_.join_timeout) {
    if (!previous_over) {
      throw TimeoutError(fmt::format(
          "waited {:.0f} s to join the elastic job, which runs on its most nodes ({}) and took no newcomer; "
          "start this node when one of them is gone, or raise the most nodes of `nnodes`",
          seconds_of(settings_.join_timeout), settings_.max_nodes));
    }
    throw TimeoutError(fmt::format(
        "waited {:.0f} s for the elastic job's least number of nodes ({}), but {} came; start the other nodes' "
        "tandem run with the same `rdzv_endpoint` and `run_id`, or raise join_timeout in `rdzv_conf`",
        seconds_of(settings_.join_timeout), settings_.min_nodes, joined));
  }
  return std::nullopt;
}

int64_t RoundRendezvous::waiting() const { return store_->add(round_key(round_ + 1, "joined"), 0); }

void RoundRendezvous::beat() { store_->add(round_key(round_, fmt::format("beat/{}", slot_)), 1); }

std::optional<RoundEnd> RoundRendezvous::watch(Clock::time_point now) {
  if (auto end = ended(round_)) return end;
  const int nodes = membership_ ? membership_->nodes : 0;
  for (int64_t slot = 1; slot <= nodes; ++slot) {
    if (slot == slot_) continue;
    const int64_t count = store_->add(round_key(round_, fmt::format("beat/{}", slot)), 0);
    auto [entry, inserted] = heartbeats_.emplace(slot, std::make_pair(count, now));
    if (!inserted && entry->second.first != count) entry->second = {count, now};
    const auto still = now - entry->second.second;
    if (still >= settings_.heartbeat_lost_after()) {
      const std::string member = read(round_key(round_, fmt::format("member/{}", slot)));
      return end_round({true, fmt::format("node {} ({}) was lost: no heartbeat for {:.1f} s", slot - 1, member,
                                          seconds_of(settings_.heartbeat_lost_after()))});
    }
  }
  if (nodes < settings_.max_nodes && waiting() > 0) {
    return end_round({false, fmt::format("a node is waiting to join the {} running", nodes)});
  }
  return std::nullopt;
}

RoundEnd RoundRendezvous::end_round(const RoundEnd& end) {
  return decode_end(text_of(store_->compareSet(round_key(round_, "ended"), {}, bytes_of(encode_end(end)))));
}

bool RoundRendezvous::mark_succeeded() {
  store_->add(round_key(round_, "succeeded"), 1);
  return all_succeeded();
}

bool RoundRendezvous::all_succeeded() {
  const int nodes = membership_ ? membership_->nodes : 0;
  if (store_->add(round_key(round_, "succeeded"), 0) < nodes) return false;
  store_->compareSet(kDoneKey, {}, bytes_of("1"));
  return true;
}

void RoundRendezvous::leave() { store_->add(round_key(round_, "left"), 1); }

int64_t RoundRendezvous::left() const { return store_->add(round_key(round_, "left"), 0); }

}  // namespace tandem::launch
