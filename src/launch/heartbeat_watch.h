#pragma once
// The heartbeats of a running round, on a thread of their own: every keep_alive_interval this agent adds to its
// heartbeat and watches the round (RoundRendezvous::beat and watch, through `tick`). A store that answers slowly
// then holds up only this thread, never the supervision of the workers. Once the round has ended, or the store
// failed, the watch stops beating and its fd becomes readable: the Supervisor, polling it, stops the workers.
//
// Private to the launcher (elastic_agent.cpp). `tick` must itself give up on a store that does not answer (the
// agent's calls are bounded), so the thread always ends.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "tandem/launch/round_rendezvous.h"

namespace tandem::launch {

class HeartbeatWatch {
 public:
  // `tick` beats and watches once; it returns the round's end once there is one and throws when the store
  // fails.
  using Tick = std::function<std::optional<RoundEnd>()>;
  HeartbeatWatch(Tick tick, std::chrono::milliseconds interval);
  // Stops and joins the thread (a tick under way ends within the agent's bound on store calls).
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

  Tick tick_;
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
