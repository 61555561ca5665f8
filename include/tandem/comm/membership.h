#pragma once
// In-job recovery's membership (docs/recovery.md): which worker slots of a job train together, epoch by epoch.
// A slot is a worker's place in the job (its first RANK); a lost worker's replacement takes its slot back. The
// launcher decides each membership epoch, since it alone sees its workers exit and its replacements get ready,
// and publishes it in the rendezvous store (MembershipKeys); each worker forms the communicator of every epoch it
// is in, over that epoch's keys alone, so that nothing of a lost worker's half-done collectives reaches the new
// group. Epoch 0 is every slot, with the communicator that init_process_group made.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <string>
#include <vector>

#include "tandem/comm/communicator.h"
#include "tandem/comm/rank_layout.h"
#include "tandem/comm/rendezvous.h"

namespace tandem::comm {

// What `tandem run --recovery in-job` tells its workers: kInJobRecovery in kRecoveryVariable, and, in a lost
// worker's replacement, kReplacementVariable set to 1.
inline constexpr const char* kRecoveryVariable = "TANDEM_RECOVERY";
inline constexpr const char* kInJobRecovery = "in-job";
inline constexpr const char* kReplacementVariable = "TANDEM_RECOVERY_REPLACEMENT";
// Under in-job recovery, the descriptor of a pipe to the launcher: the worker writes kHeartbeat into it every
// kHeartbeatInterval from a thread of its own while it has a membership, and kHeartbeatsEnd when that ends; the
// launcher kills a worker whose heartbeat stood still in between (a process stopped or frozen whole, which no
// collective fails for), so that the others go on without it.
inline constexpr const char* kHeartbeatVariable = "TANDEM_HEARTBEAT_FD";
inline constexpr std::chrono::milliseconds kHeartbeatInterval{250};
inline constexpr char kHeartbeat = 1;
inline constexpr char kHeartbeatsEnd = 0;

enum class RecoveryRole {
  kNone,         // no in-job recovery: a lost worker ends the attempt
  kMember,       // a worker of the job's first start
  kReplacement,  // started for a lost worker: it holds no training state until it is taken in
};
// Whether the launcher asked its workers for in-job recovery (kRecoveryVariable).
bool in_job_recovery_requested();
// This process's role, from the environment. Throws InvalidArgument where the group cannot be re-formed in the
// process: the mpi backend, whose world is fixed when MPI starts.
RecoveryRole recovery_role(const std::string& backend, const RankLayout& layout);

// The store keys that the launcher and the workers share, under the keys of the launcher's attempt.
struct MembershipKeys {
  // The newest epoch the launcher published, as a decimal number; absent while epoch 0 stands.
  static std::string newest() { return "recovery/newest"; }
  // Epoch `epoch`'s slots, "0,2", written before newest() names it.
  static std::string members(int epoch) { return "recovery/members/" + std::to_string(epoch); }
  // Set by a replacement once it can be taken in (its data loaded, its model built).
  static std::string ready(int slot) { return "recovery/ready/" + std::to_string(slot); }
  // Set by a replacement once it formed a membership with the others: it trains with them from then on.
  static std::string joined(int slot) { return "recovery/joined/" + std::to_string(slot); }
  // How many of epoch `epoch`'s members arrived to form it, and whether it formed or was given up (advance()).
  static std::string arrivals(int epoch) { return "recovery/arrivals/" + std::to_string(epoch); }
  static std::string fate(int epoch) { return "recovery/fate/" + std::to_string(epoch); }
  // The prefix of epoch `epoch`'s communicator's keys.
  static std::string group(int epoch) { return "recovery/group/" + std::to_string(epoch) + "/"; }
  // Set by the members once training is over: a replacement not taken in by then is too late, and ends well.
  static std::string closed() { return "recovery/closed"; }
};

std::string format_slots(const std::vector<int>& slots);
// Throws Error on text that format_slots did not write.
std::vector<int> parse_slots(const std::string& text);

class Membership {
 public:
  // Connects a communicator of `world_size` ranks, this one `rank`, over `store` (an epoch's keys).
  using Connect = std::function<CommunicatorPtr(const StorePtr& store, int rank, int world_size)>;

  // `store`: the attempt's store. `slot`: this worker's; `slots`: the job's. `first`: epoch 0's communicator,
  // null for a replacement, which holds no training state until it is taken in. `timeout`: how long to wait for
  // the launcher's next epoch, and the new communicator's connection.
  // `watch_interval`: how often a worker looks for a newer epoch in the store (one read; two where there is one),
  // to abandon its waits when a member was lost (watch()).
  Membership(StorePtr store, int slot, int slots, Connect connect, CommunicatorPtr first,
             std::chrono::milliseconds timeout, std::chrono::milliseconds watch_interval = kWatchInterval);
  // On one node, tens of workers: a few hundred reads a second for the store.
  static constexpr std::chrono::milliseconds kWatchInterval{50};
  // Communicators of earlier epochs are never destroyed: c10d's Gloo has no abort, and its destructor joins
  // threads that may still wait on a lost peer until the timeout. The process's exit releases them.
  ~Membership();
  Membership(const Membership&) = delete;
  Membership& operator=(const Membership&) = delete;

  int slot() const { return slot_; }
  int slots() const { return slots_; }
  // The current epoch: its number and slots (sorted; a member's rank is its index), and its communicator (null
  // for a replacement not yet taken in).
  int epoch() const { return epoch_; }
  const std::vector<int>& members() const { return members_; }
  const CommunicatorPtr& communicator() const { return communicator_; }
  bool joined() const { return communicator_ != nullptr; }

  // The newest epoch the launcher has published: one read of the store.
  int published() const;
  // The newest epoch this worker's watcher saw published, at most a watch interval ago: no store read.
  int newest_seen() const { return newest_seen_; }
  // A replacement says that it can be taken in.
  void announce_ready();
  // Waits for an epoch newer than the current one and forms its communicator; the current one is retired.
  // Returns false, for a replacement, when the members closed the run before it was taken in (close()). Throws
  // Error when this slot is not a member of it (the launcher counted this worker lost), or when none is
  // published within the timeout.
  bool advance();
  // Training is over: no replacement is taken in after this. Every member says so, so that the launcher's other
  // nodes need not learn it from this one's.
  void close();

 private:
  StorePtr store_;
  int slot_, slots_;
  Connect connect_;
  std::chrono::milliseconds timeout_;
  std::chrono::milliseconds watch_interval_;
  int epoch_ = 0;
  std::vector<int> members_;
  CommunicatorPtr communicator_;
  std::vector<CommunicatorPtr>* retired_;  // leaked on purpose: see the destructor

  void watch();
  bool forms(int epoch, size_t members);
  bool closed_before_taken_in() const;
  // While the members of an epoch arrive: how long to wait for its fate before looking for a newer epoch.
  static constexpr std::chrono::milliseconds kArrivalPoll{20};
  // Guards epoch_, members_ and communicator_ against the watcher, which reads them.
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::atomic<int> newest_seen_{0};
  std::thread watcher_;
};

}  // namespace tandem::comm
