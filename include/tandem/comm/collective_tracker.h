#pragma once
// Knows, when a collective fails, which ranks were lost and which had not reached it. Each rank counts the
// collectives it issues (the hot path costs one atomic increment) and a background thread publishes the count
// with a tick number to the rendezvous store every 200 ms. On failure, ranks whose published value stood still
// for a while are lost (process gone, host or network down); failing that, ranks whose published count is
// below the failed collective's number are the ones that never arrived.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

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

  CollectiveTracker(StorePtr store, int rank, int world_size);
  ~CollectiveTracker();
  CollectiveTracker(const CollectiveTracker&) = delete;
  CollectiveTracker& operator=(const CollectiveTracker&) = delete;

  // Called as a collective is issued; returns its 1-based sequence number on this rank.
  uint64_t begin();

  // Turns a backend failure of collective `sequence` into TimeoutError or CommError with a message naming the
  // operation, this rank, and the ranks that were lost or never reached it. Takes kSilence to watch the
  // heartbeats, and at most kDiagnosisDeadline when the store does not answer. Never returns.
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
