#include "in_job_recovery.h"

#include <fmt/format.h>

#include <sstream>

#include "tandem/comm/membership.h"
#include "tandem/util/call_within.h"

namespace tandem::launch {
namespace {

// What tandem's programs exit with when they refuse their flags or input (apps/main.cpp).
constexpr int kRefusedInput = 2;

// The launchers' own keys, beside the workers' (comm::MembershipKeys). A report is "SLOT AWAITING": the slot
// left the membership, and AWAITING 1 where its replacement or its node is to come back.
const std::string kReportCount = "recovery/reports";
std::string report_key(int64_t index) { return fmt::format("recovery/report/{}", index); }
// How many replacements the job's launchers started, against --max-restarts.
const std::string kReplacementCount = "recovery/replacements";

// One more replacement, if --max-restarts leaves one to the job (`allowed`): the count of every node's, this one
// included, or 0 where none is left.
int take_replacement(const comm::StorePtr& store, int allowed) {
  if (allowed <= 0) return 0;
  const int64_t used = store->add(kReplacementCount, 1);
  return used <= allowed ? static_cast<int>(used) : 0;
}

void write_report(const comm::StorePtr& store, int slot, bool awaiting) {
  const int64_t index = store->add(kReportCount, 1);
  store->set(report_key(index), comm::store_bytes(fmt::format("{} {}", slot, awaiting ? 1 : 0)));
}

}  // namespace

InJobRecovery::InJobRecovery(comm::StorePtr store, int slots, Place place, int replacements_allowed,
                             std::chrono::milliseconds report_within)
    : store_(std::move(store)), slots_(slots), place_(place), report_within_(report_within),
      replacements_allowed_(replacements_allowed) {
  for (int slot = 0; slot < slots; ++slot) members_.insert(slot);
}

bool InJobRecovery::local(int slot) const {
  return slot >= place_.first_slot && slot < place_.first_slot + place_.node_slots;
}

bool InJobRecovery::remote_members() const {
  for (int slot : members_) {
    if (!local(slot)) return true;
  }
  return false;
}

bool InJobRecovery::needs_polling() const {
  return place_.decides && (!awaiting_.empty() || !admitted_.empty() || remote_members());
}

InJobRecovery::Loss InJobRecovery::lose(int slot, int exit_code, int members_running) {
  Loss loss;
  if (exit_code == kRefusedInput || slot == 0) return loss;
  if (!place_.decides) {
    // The deciding launcher learns it from the store; a store that does not take the report in time is lost
    // with the job, and this node ends its attempt.
    auto reported = call_within(report_within_, [store = store_, slot, allowed = replacements_allowed_] {
      Loss sent;
      sent.recovered = true;
      sent.replacements_used = take_replacement(store, allowed);
      sent.replace = sent.replacements_used > 0;
      write_report(store, slot, sent.replace);
      return sent;
    });
    if (!reported) return loss;
    loss = *reported;
    replacements_started_ += loss.replace ? 1 : 0;
    return loss;
  }
  const bool others_train = members_running > 0 || remote_members();
  if (awaiting_.erase(slot) > 0) {
    // A replacement lost before it was taken in: the members never counted it. A readiness it announced is void.
    store_->deleteKey(comm::MembershipKeys::ready(slot));
    loss.recovered = others_train;
  } else {
    if (!others_train) return loss;
    admitted_.erase(slot);
    members_.erase(slot);
    publish();
    loss.recovered = true;
  }
  if (loss.recovered && (loss.replacements_used = take_replacement(store_, replacements_allowed_)) > 0) {
    ++replacements_started_;
    awaiting_.insert(slot);
    loss.replace = true;
  }
  return loss;
}

void InJobRecovery::report_node_lost(const comm::StorePtr& store, int first_slot, int node_slots) {
  for (int slot = first_slot; slot < first_slot + node_slots; ++slot) write_report(store, slot, true);
}

// The other nodes' reports since the last poll. A slot reported lost leaves the members (or, a replacement not
// yet taken in, the awaited); where the report says so, its replacement or its node is awaited.
void InJobRecovery::apply_reports() {
  // One node's launcher is told nothing: it sees every loss itself.
  if (place_.node_slots == slots_) return;
  const int64_t reports = store_->add(kReportCount, 0);
  bool changed = false;
  for (; reports_read_ < reports; ++reports_read_) {
    std::istringstream report(comm::store_text(store_->get(report_key(reports_read_ + 1))));
    int slot = -1, awaiting = 0;
    report >> slot >> awaiting;
    if (awaiting_.erase(slot) > 0) {
      store_->deleteKey(comm::MembershipKeys::ready(slot));
    } else if (members_.erase(slot) > 0) {
      admitted_.erase(slot);
      changed = true;
    }
    if (awaiting != 0) awaiting_.insert(slot);
  }
  if (changed) publish();
}

std::vector<int> InJobRecovery::take_in_ready() {
  if (!place_.decides) return {};
  apply_reports();
  std::vector<int> taken;
  for (int slot : awaiting_) {
    if (!store_->check({comm::MembershipKeys::ready(slot)})) continue;
    store_->deleteKey(comm::MembershipKeys::ready(slot));
    members_.insert(slot);
    admitted_.insert(slot);
    taken.push_back(slot);
  }
  for (int slot : taken) awaiting_.erase(slot);
  if (!taken.empty()) publish();
  return taken;
}

std::vector<int> InJobRecovery::joined() {
  std::vector<int> joined;
  for (int slot : admitted_) {
    if (!store_->check({comm::MembershipKeys::joined(slot)})) continue;
    store_->deleteKey(comm::MembershipKeys::joined(slot));
    joined.push_back(slot);
  }
  for (int slot : joined) admitted_.erase(slot);
  return joined;
}

// The members first, then the epoch's number: a worker that reads the number finds its members.
void InJobRecovery::publish() {
  ++epoch_;
  store_->set(comm::MembershipKeys::members(epoch_),
              comm::store_bytes(comm::format_slots(std::vector<int>(members_.begin(), members_.end()))));
  store_->set(comm::MembershipKeys::newest(), comm::store_bytes(std::to_string(epoch_)));
}

}  // namespace tandem::launch
