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

  CollectiveTracker(StorePtr store, int rank, int world_size);
  ~CollectiveTracker();
  CollectiveTracker(const CollectiveTracker&) = delete;
  CollectiveTracker& operator=(const CollectiveTracker&) = delete;

  // Called as a collective is issued; returns its 1-based sequence number on this rank.
  uint64_t begin();

  // Turns a backend failure of collective `sequence` into TimeoutError or CommError with a message naming the
  // operation, this rank, and the ranks that were lost or never reached it. Takes kSilence to watch the
  // heartbeats. Never returns.
  [[noreturn]] void fail(const std::string& operation, uint64_t sequence, const std::string& backend_message,
                         std::chrono::milliseconds timeout);

 private:
  void publish_loop();
  // What the store says about the other ranks, for the failure message of collective `sequence`.
  std::string diagnose(uint64_t sequence);
  std::vector<int> silent_ranks();
  // Rank r's last published "<count> <tick>", or "" before its first.
  std::string published(int rank);

  StorePtr store_;
  int rank_;
  int world_size_;
  std::atomic<uint64_t> issued_{0};
  std::mutex mutex_;
  std::condition_variable stop_signal_;
  bool stopping_ = false;
  std::thread publisher_;
};

}  // namespace tandem::comm
