#pragma once
// Knows, when a collective fails, which ranks were lost, which had not reached it, and which were in another
// collective. Each rank numbers the collectives it issues and remembers the signatures (kind, dtype, element
// count) of its last kRemembered; a background thread publishes the count with a tick number, and the
// remembered signatures whenever the count moved, to the rendezvous store every 200 ms. On failure, ranks whose
// published value stood still for a while are lost (process gone, host or network down); failing that, ranks
// whose signature of the failed collective's number differs are in another collective, and ranks whose count
// is below it never arrived.
//
// Under TANDEM_DISTRIBUTED_DEBUG=DETAIL the communicator also calls agree() before each collective starts, so
// that ranks that disagree stop before the transport sees two different collectives.
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "tandem/comm/collective_signature.h"
#include "tandem/comm/rendezvous.h"

namespace tandem::comm {

class CollectiveTracker {
 public:
  // How often the background thread publishes.
  static constexpr std::chrono::milliseconds kTick{200};
  // How long a rank's published value must stand still before a failure calls it lost: five ticks, so that a
  // busy machine that delays one tick does not make a live rank look lost.
  static constexpr std::chrono::milliseconds kSilence{1000};
  // How long a failure waits for the store to answer its questions before it calls the store unreachable.
  static constexpr std::chrono::milliseconds kDiagnosisDeadline{6000};
  // How many of its latest collectives a rank remembers and publishes: a rank stuck in wait() on collective n
  // may have issued more after it (DDP keeps one all-reduce per bucket in flight), and a failure of n compares
  // the ranks' signatures of n.
  static constexpr uint64_t kRemembered = 64;

  CollectiveTracker(StorePtr store, int rank, int world_size);
  ~CollectiveTracker();
  CollectiveTracker(const CollectiveTracker&) = delete;
  CollectiveTracker& operator=(const CollectiveTracker&) = delete;

  // Called as a collective is issued; returns its 1-based sequence number on this rank. Costs a lock and a copy
  // of the signature; the store is written by the background thread only.
  uint64_t begin(CollectiveSignature signature);

  // Collective over the store, before collective `sequence` (this rank's latest begin()) starts: publishes its
  // signature and waits for every rank's. Where they differ, throws CommError naming which rank is in which
  // collective; where a rank does not publish within `timeout`, reports it as fail() does.
  void agree(uint64_t sequence, std::chrono::milliseconds timeout);

  // Turns a backend failure of collective `sequence` into TimeoutError or CommError with a message naming the
  // operation, this rank, and the ranks that were lost, were in another collective, or never reached it. Takes
  // kSilence to watch the heartbeats, and at most kDiagnosisDeadline when the store does not answer. Never
  // returns.
  [[noreturn]] void fail(const std::string& operation, uint64_t sequence, const std::string& backend_message,
                         std::chrono::milliseconds timeout);

  // The state the background threads use, shared with them (defined in collective_tracker.cpp): LibTorch
  // 2.x's TCPStore client waits for an answer without a deadline, so a thread caught in a call to a store whose
  // host is gone may never return, and it must then be left behind without touching a destroyed tracker.
  struct Shared;

 private:
  std::shared_ptr<Shared> shared_;
  std::thread publisher_;
};

}  // namespace tandem::comm
