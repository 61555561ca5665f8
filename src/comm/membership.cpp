#include "tandem/comm/membership.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <algorithm>
#include <cstdlib>

#include "tandem/util/error.h"

namespace tandem::comm {
namespace {

std::string text_of(const std::vector<uint8_t>& bytes) { return std::string(bytes.begin(), bytes.end()); }
std::vector<uint8_t> bytes_of(const std::string& text) { return std::vector<uint8_t>(text.begin(), text.end()); }

}  // namespace

bool in_job_recovery_requested() {
  const char* recovery = std::getenv(kRecoveryVariable);
  return recovery != nullptr && std::string(recovery) == kInJobRecovery;
}

RecoveryRole recovery_role(const std::string& backend, const RankLayout& layout) {
  if (!in_job_recovery_requested() || !layout.distributed()) return RecoveryRole::kNone;
  if (backend == "mpi") {
    throw InvalidArgument("in-job recovery re-forms the group in each process, and mpi's world is fixed when MPI "
                          "starts: use the gloo or nccl `backend`, or let `tandem run` restart the workers");
  }
  const char* replacement = std::getenv(kReplacementVariable);
  return replacement != nullptr && std::string(replacement) == "1" ? RecoveryRole::kReplacement
                                                                   : RecoveryRole::kMember;
}

std::string format_slots(const std::vector<int>& slots) { return fmt::format("{}", fmt::join(slots, ",")); }

std::vector<int> parse_slots(const std::string& text) {
  std::vector<int> slots;
  size_t begin = 0;
  while (begin < text.size()) {
    const size_t end = std::min(text.find(',', begin), text.size());
    try {
      slots.push_back(std::stoi(text.substr(begin, end - begin)));
    } catch (const std::exception&) {
      throw Error(fmt::format("the launcher's membership '{}' in the rendezvous store is not a list of slots", text));
    }
    begin = end + 1;
  }
  return slots;
}

Membership::Membership(StorePtr store, int slot, int slots, Connect connect, CommunicatorPtr first,
                       std::chrono::milliseconds timeout)
    : store_(std::move(store)),
      slot_(slot),
      slots_(slots),
      connect_(std::move(connect)),
      timeout_(timeout),
      communicator_(std::move(first)),
      retired_(new std::vector<CommunicatorPtr>()) {
  for (int s = 0; s < slots; ++s) members_.push_back(s);
  if (communicator_) communicator_->diagnose_failures(false);
}

Membership::~Membership() {
  if (communicator_) retired_->push_back(std::move(communicator_));
}

int Membership::published() const {
  if (!store_->check({MembershipKeys::newest()})) return 0;
  return std::stoi(text_of(store_->get(MembershipKeys::newest())));
}

void Membership::announce_ready() { store_->set(MembershipKeys::ready(slot_), bytes_of("1")); }

void Membership::advance() {
  int epoch = epoch_;
  std::vector<int> members;
  std::vector<int>::const_iterator found;
  do {
    const int next = epoch + 1;
    // The launcher writes an epoch's members before it names the epoch newest: waiting for the members of the
    // next epoch is waiting for the launcher's decision. It may publish several at once (a loss during a join):
    // the newest counts.
    try {
      store_->wait({MembershipKeys::members(next)}, timeout_);
    } catch (const std::exception& error) {
      throw CommError(fmt::format("slot {} waited {:.0f} s for the launcher's membership epoch {}, in vain ({}); was "
                                  "this worker started by tandem run with in-job recovery?",
                                  slot_, timeout_.count() / 1000.0, next, first_line(error.what())));
    }
    epoch = std::max(next, published());
    members = parse_slots(text_of(store_->get(MembershipKeys::members(epoch))));
    found = std::find(members.cbegin(), members.cend(), slot_);
    if (found == members.cend() && joined()) {
      throw CommError(fmt::format("the launcher left slot {} out of membership epoch {} ({}): it counted this "
                                  "worker lost",
                                  slot_, epoch, format_slots(members)));
    }
    // A replacement waits through the epochs that do not take it in yet.
  } while (found == members.cend());
  const int rank = static_cast<int>(found - members.cbegin());
  if (communicator_) retired_->push_back(std::move(communicator_));
  epoch_ = epoch;
  members_ = std::move(members);
  auto group_store = c10::make_intrusive<c10d::PrefixStore>(MembershipKeys::group(epoch), store_);
  communicator_ = connect_(group_store, rank, static_cast<int>(members_.size()));
  communicator_->diagnose_failures(false);
}

}  // namespace tandem::comm
