#include "in_job_recovery.h"

#include "tandem/comm/membership.h"

namespace tandem::launch {
namespace {

// What tandem's programs exit with when they refuse their flags or input (apps/main.cpp).
constexpr int kRefusedInput = 2;

}  // namespace

InJobRecovery::InJobRecovery(comm::StorePtr store, int slots, int replacements_allowed)
    : store_(std::move(store)), replacements_left_(replacements_allowed) {
  for (int slot = 0; slot < slots; ++slot) members_.insert(slot);
}

InJobRecovery::Loss InJobRecovery::lose(int slot, int exit_code, int members_running) {
  Loss loss;
  if (exit_code == kRefusedInput) return loss;
  if (awaiting_.erase(slot) > 0) {
    // A replacement lost before it was taken in: the members never counted it. A readiness it announced is void.
    store_->deleteKey(comm::MembershipKeys::ready(slot));
    loss.recovered = members_running > 0;
  } else {
    if (slot == 0 || members_running == 0) return loss;
    admitted_.erase(slot);
    members_.erase(slot);
    publish();
    loss.recovered = true;
  }
  if (loss.recovered && replacements_left_ > 0) {
    --replacements_left_;
    ++replacements_started_;
    awaiting_.insert(slot);
    loss.replace = true;
  }
  return loss;
}

std::vector<int> InJobRecovery::take_in_ready() {
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
