#include "tandem/comm/membership.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>

#include "tandem/util/error.h"

namespace tandem::comm {

namespace {

// Non-blocking: a launcher that does not read (a full pipe) or is gone loses beats, never the watcher.
void send_heartbeat(int fd, char byte) {
  ssize_t ignored = ::write(fd, &byte, 1);
  (void)ignored;
}

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
                       std::chrono::milliseconds timeout, std::chrono::milliseconds watch_interval)
    : store_(std::move(store)),
      slot_(slot),
      slots_(slots),
      connect_(std::move(connect)),
      timeout_(timeout),
      watch_interval_(watch_interval),
      communicator_(std::move(first)),
      retired_(new std::vector<CommunicatorPtr>()) {
  for (int s = 0; s < slots; ++s) members_.push_back(s);
  // A retired communicator's Gloo threads may still write to a lost peer; once that peer's host answers again
  // (a cut link back up, with the lost process gone) the write meets a reset. It must fail, not end this worker
  // with SIGPIPE, whose default kills: Python ignores SIGPIPE at start-up, a C++ program must say so itself.
  ::signal(SIGPIPE, SIG_IGN);
  if (communicator_) communicator_->serve_membership();
  watcher_ = std::thread([this] { watch(); });
}

Membership::~Membership() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  watcher_.join();
  if (communicator_) retired_->push_back(std::move(communicator_));
}

// Every watch interval: the newest epoch published, and where it or an epoch before it leaves out a member of the
// current one, the current communicator abandoned, so that no member waits on for a peer that stopped answering. An epoch that only
// adds members (a replacement taken in) abandons nothing: the members change at a step boundary instead.
void Membership::watch() {
  std::unique_lock<std::mutex> lock(mutex_);
  int abandoned_epoch = -1;
  const char* heartbeat = std::getenv(kHeartbeatVariable);
  const int heartbeat_fd = heartbeat != nullptr ? std::atoi(heartbeat) : -1;
  auto beaten = std::chrono::steady_clock::now() - kHeartbeatInterval;
  while (!wake_.wait_for(lock, watch_interval_, [this] { return stopping_; })) {
    if (heartbeat_fd >= 0 && std::chrono::steady_clock::now() - beaten >= kHeartbeatInterval) {
      send_heartbeat(heartbeat_fd, kHeartbeat);
      beaten = std::chrono::steady_clock::now();
    }
    const int watched = epoch_;
    const std::vector<int> members = members_;
    const CommunicatorPtr communicator = communicator_;
    lock.unlock();
    try {
      const int newest = published();
      newest_seen_ = newest;
      if (newest > watched && abandoned_epoch != watched && communicator) {
        // Every epoch since the watched one: a slot lost and taken in again (its replacement) left one of them.
        bool someone_lost = false;
        for (int epoch = watched + 1; epoch <= newest && !someone_lost; ++epoch) {
          const std::vector<int> next = parse_slots(store_text(store_->get(MembershipKeys::members(epoch))));
          someone_lost = std::any_of(members.begin(), members.end(), [&](int slot) {
            return std::find(next.begin(), next.end(), slot) == next.end();
          });
        }
        if (someone_lost) {
          communicator->abandon_waits();
          abandoned_epoch = watched;
        }
      }
    } catch (const std::exception&) {
      // The store is gone with the launcher: the next collective or advance() reports that.
    }
    lock.lock();
  }
  // What the process does after its membership (saving, tearing down) is not judged.
  if (heartbeat_fd >= 0) send_heartbeat(heartbeat_fd, kHeartbeatsEnd);
}

int Membership::published() const {
  if (!store_->check({MembershipKeys::newest()})) return 0;
  return std::stoi(store_text(store_->get(MembershipKeys::newest())));
}

// Every member of `epoch` says it arrived; the epoch forms when all `members` have, and is given up when the
// launcher published a newer one first (a member lost before it arrived). Which of the two is decided once, in
// the store (compareSet on the epoch's fate), so that no member connects to a group that another gave up.
bool Membership::forms(int epoch, size_t members) {
  const std::string fate = MembershipKeys::fate(epoch);
  const std::vector<uint8_t> formed = store_bytes("formed"), given_up = store_bytes("given up");
  if (store_->add(MembershipKeys::arrivals(epoch), 1) == static_cast<int64_t>(members)) {
    store_->compareSet(fate, {}, formed);
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  while (!store_->check({fate})) {
    if (published() > epoch || closed_before_taken_in()) {
      store_->compareSet(fate, {}, given_up);
      break;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      throw CommError(fmt::format("slot {}: the other members of membership epoch {} did not arrive within {:.0f} s",
                                  slot_, epoch, timeout_.count() / 1000.0));
    }
    try {
      store_->wait({fate}, kArrivalPoll);
    } catch (const std::exception&) {
      // Not decided yet: look for a newer epoch again.
    }
  }
  return store_->get(fate) == formed;
}

void Membership::announce_ready() { store_->set(MembershipKeys::ready(slot_), store_bytes("1")); }

bool Membership::closed_before_taken_in() const {
  return !joined() && store_->check({MembershipKeys::closed()});
}

void Membership::close() { store_->set(MembershipKeys::closed(), store_bytes("1")); }

bool Membership::advance() {
  int epoch = epoch_;
  std::vector<int> members;
  std::vector<int>::const_iterator found;
  do {
    const int next = epoch + 1;
    // The launcher writes an epoch's members before it names the epoch newest: waiting for the members of the
    // next epoch is waiting for the launcher's decision. It may publish several at once (a loss during a join):
    // the newest counts.
    // A replacement waits in slices, to see the members close the run meanwhile; a member waits for good.
    const auto deadline = std::chrono::steady_clock::now() + timeout_;
    while (true) {
      if (closed_before_taken_in()) return false;
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      try {
        store_->wait({MembershipKeys::members(next)}, joined() ? left : std::min(left, kArrivalPoll * 5));
        break;
      } catch (const std::exception& error) {
        if (std::chrono::steady_clock::now() < deadline) continue;
        throw CommError(fmt::format("slot {} waited {:.0f} s for the launcher's membership epoch {}, in vain ({}); "
                                    "was this worker started by tandem run with in-job recovery?",
                                    slot_, timeout_.count() / 1000.0, next, first_line(error.what())));
      }
    }
    epoch = std::max(next, published());
    members = parse_slots(store_text(store_->get(MembershipKeys::members(epoch))));
    found = std::find(members.cbegin(), members.cend(), slot_);
    if (found == members.cend() && joined()) {
      throw CommError(fmt::format("the launcher left slot {} out of membership epoch {} ({}): it counted this "
                                  "worker lost",
                                  slot_, epoch, format_slots(members)));
    }
    // A replacement waits through the epochs that do not take it in yet; every member goes on to a newer epoch
    // where this one was given up.
  } while (found == members.cend() || !forms(epoch, members.size()));
  const int rank = static_cast<int>(found - members.cbegin());
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (communicator_) retired_->push_back(std::move(communicator_));
    epoch_ = epoch;
    members_ = std::move(members);
  }
  auto group_store = c10::make_intrusive<c10d::PrefixStore>(MembershipKeys::group(epoch), store_);
  CommunicatorPtr formed = connect_(group_store, rank, static_cast<int>(members_.size()));
  formed->serve_membership();
  const bool taken_in = !joined();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    communicator_ = std::move(formed);
  }
  if (taken_in) store_->set(MembershipKeys::joined(slot_), store_bytes("1"));
  return true;
}

}  // namespace tandem::comm
