#pragma once
// The heartbeats of a running round, on a thread of their own: every keep_alive_interval this agent adds to its
// heartbeat and watches the round (RoundRendezvous::beat and watch, through `tick`). A store that answers slowly
// then holds up only this thread, never the supervision of the workers. Once the round has ended, or the store
// failed, the watch stops beating and its fd becomes readable: the Supervisor, polling it, stops the workers.
//
// The timing contract of a node cut off (docs/launcher.md, "A cut link"): the others take a node for lost once its
// heartbeat stood still for `give_up_after` (keep_alive_interval x keep_alive_max_attempt) on their clocks, which
// is at least that long after the send of this agent's newest answered tick. So each tick must be answered by
// `give_up_after` after the send of the newest answered one (the first: after `started`); when it is not, the
// watch fails as a lost store, and its agent starts stopping its workers no later than the others find it lost.
// The round after a loss waits ElasticSettings::worker_stop_time before it closes, so these workers are gone
// before the next round's start (and no checkpoint pruning of theirs meets the next round's loading).
//
// Private to the launcher (elastic_agent.cpp). `tick` must itself give up by the time it is given (the agent's
// calls are bounded), so the thread always ends.
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
  using Clock = std::chrono::steady_clock;
  // `tick` beats and watches once; it returns the round's end once there is one, and throws when the store
  // fails or gave no answer by `answer_by`.
  using Tick = std::function<std::optional<RoundEnd>(Clock::time_point answer_by)>;
  HeartbeatWatch(Tick tick, std::chrono::milliseconds interval, std::chrono::milliseconds give_up_after,
                 Clock::time_point started);
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
  std::chrono::milliseconds give_up_after_;
  Clock::time_point answered_send_;  // the send of the newest answered tick (before any: the round's start)
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
