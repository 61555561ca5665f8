#pragma once
// Knows, when a collective fails, which ranks had not reached it. Each rank counts the collectives it issues
// and a background thread publishes the count to the rendezvous store (at most every 200 ms, and only when it
// changed, so the hot path costs one atomic increment). On failure, the ranks whose published count is below
// the failed collective's number are the ones that never arrived.
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>

#include "tandem/comm/rendezvous.h"

namespace tandem::comm {

class CollectiveTracker {
 public:
  CollectiveTracker(StorePtr store, int rank, int world_size);
  ~CollectiveTracker();
  CollectiveTracker(const CollectiveTracker&) = delete;
  CollectiveTracker& operator=(const CollectiveTracker&) = delete;

  // Called as a collective is issued; returns its 1-based sequence number on this rank.
  uint64_t begin();

  // Turns a backend failure of collective `sequence` into TimeoutError or CommError with a message naming the
  // operation, this rank, and the ranks that never reached it. Never returns.
  [[noreturn]] void fail(const std::string& operation, uint64_t sequence, const std::string& backend_message,
                         std::chrono::milliseconds timeout);

 private:
  void publish_loop();
  std::string laggards(uint64_t sequence);

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
