#pragma once
// Knows, when a collective fails, which ranks were lost, which had not reached it, and which were in another
// collective. Each rank numbers the collectives it issues and remembers the signatures (kind, dtype, element
// count) of its last kRemembered, in memory: while every collective succeeds, the tracker writes nothing to the
// rendezvous store. A failing rank asks the others through the store (one counter, tandem/diagnosis/requests),
// and a background thread of each rank, which looks at that counter every kPoll (a read: it grows no FileStore),
// answers with its count and remembered signatures. Ranks that do not answer within kAnswerWait are lost
// (process gone, host or network down); failing that, ranks whose signature of the failed collective's number
// differs are in another collective, and ranks whose count is below it never arrived.
//
// Under TANDEM_DISTRIBUTED_DEBUG=DETAIL the communicator also calls agree() before each collective starts, so
// that ranks that disagree stop before the transport sees two different collectives; that writes to the store
// for every collective, which is why it is for debugging only.
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
  // How often the background thread looks for a request to answer: one store read per rank per kPoll, the
  // tracker's whole traffic while nothing fails.
  static constexpr std::chrono::milliseconds kPoll{1000};
  // How long a failure waits for the other ranks' answers before it calls the silent ones lost: three polls, so
  // that a busy machine that delays a rank's poll does not make a live rank look lost.
  static constexpr std::chrono::milliseconds kAnswerWait{3 * kPoll};
  // How long a failure waits for the store to answer its questions before it calls the store unreachable.
  static constexpr std::chrono::milliseconds kDiagnosisDeadline{6000};
  // How many of its latest collectives a rank remembers and answers with: a rank stuck in wait() on collective n
  // may have issued more after it (DDP keeps one all-reduce per bucket in flight), and a failure of n compares
  // the ranks' signatures of n.
  static constexpr uint64_t kRemembered = 64;

  CollectiveTracker(StorePtr store, int rank, int world_size);
  ~CollectiveTracker();
  CollectiveTracker(const CollectiveTracker&) = delete;
  CollectiveTracker& operator=(const CollectiveTracker&) = delete;

  // Called as a collective is issued; returns its 1-based sequence number on this rank. Costs a lock and a copy
  // of the signature; the store sees nothing of it.
  uint64_t begin(CollectiveSignature signature);

  // Collective over the store, before collective `sequence` (this rank's latest begin()) starts: publishes its
  // signature and waits for every rank's. Where they differ, throws CommError naming which rank is in which
  // collective; where a rank does not publish within `timeout`, reports it as fail() does.
  void agree(uint64_t sequence, std::chrono::milliseconds timeout);

  // Turns a backend failure of collective `sequence` into TimeoutError or CommError with a message naming the
  // operation, this rank, and the ranks that were lost, were in another collective, or never reached it. Takes
  // about kPoll for the others' answers (kAnswerWait when a rank is lost), and at most kDiagnosisDeadline when
  // the store does not answer. Never returns.
  [[noreturn]] void fail(const std::string& operation, uint64_t sequence, const std::string& backend_message,
                         std::chrono::milliseconds timeout);

  // The state the background threads use, shared with them (defined in collective_tracker.cpp): LibTorch
  // 2.x's TCPStore client waits for an answer without a deadline, so a thread caught in a call to a store whose
  // host is gone may never return, and it must then be left behind without touching a destroyed tracker.
  struct Shared;

 private:
  std::shared_ptr<Shared> shared_;
  std::thread responder_;
};

}  // namespace tandem::comm
