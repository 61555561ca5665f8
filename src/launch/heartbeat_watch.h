#pragma once
// The heartbeats of a running round, on a thread of their own: every keep_alive_interval this agent adds to its
// heartbeat and watches the round (RoundRendezvous::watch). A store that stops answering (a cut link) then holds
// up only this thread, never the supervision of the workers. Once the round has ended, or the store failed, the
// watch stops beating and its fd becomes readable: the Supervisor, polling it, stops the workers.
//
// Private to the launcher (elastic_agent.cpp). Every use of the RoundRendezvous, here and by the agent, holds
// `store_mutex`: the agent's store connection serves one operation at a time.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "tandem/launch/round_rendezvous.h"

namespace tandem::launch {

class HeartbeatWatch {
 public:
  HeartbeatWatch(RoundRendezvous& rounds, std::mutex& store_mutex, std::chrono::milliseconds interval);
  // Stops and joins the thread (a store operation under way ends within the store's operation timeout).
  ~HeartbeatWatch();
  HeartbeatWatch(const HeartbeatWatch&) = delete;
  HeartbeatWatch& operator=(const HeartbeatWatch&) = delete;

  // Readable once the round has ended or the store failed.
  int fd() const { return pipe_[0]; }
  bool finished() const { return finished_.load(); }
  // Once finished: the round's end, or, where the store failed, nothing and store_error() says why.
  std::optional<RoundEnd> ended() const;
  std::string store_error() const;

 private:
  void run();
  void finish();

  RoundRendezvous& rounds_;
  std::mutex& store_mutex_;
  std::chrono::milliseconds interval_;
  int pipe_[2] = {-1, -1};
  mutable std::mutex mutex_;  // guards stop_, ended_, store_error_
  std::condition_variable wake_;
  bool stop_ = false;
  std::optional<RoundEnd> ended_;
  std::string store_error_;
  std::atomic<bool> finished_{false};
  std::thread thread_;
};

}  // namespace tandem::launch
