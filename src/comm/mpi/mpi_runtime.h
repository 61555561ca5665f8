#pragma once
// The one thread of this process that calls MPI. Open MPI's non-blocking collectives only progress inside MPI
// calls, so a caller computing backward would stall them; instead this thread runs queued collectives in the
// order they were issued (so that collectives issued in the same order on every rank match up) while the
// caller's thread goes on computing.
//
// Created on first use and kept until exit: MPI cannot be initialised twice, so a second communicator reuses
// it. It initialises MPI (unless the program already did, with at least MPI_THREAD_SERIALIZED) and finalises
// it at exit if it initialised it.
#include <atomic>
#include <functional>
#include <memory>
#include <thread>

#include "tandem/util/task_queue.h"

namespace tandem::comm {

class MpiRuntime {
 public:
  // Throws CommError when MPI cannot start, UnsupportedError when it gives no thread support.
  static std::shared_ptr<MpiRuntime> instance();
  ~MpiRuntime();
  MpiRuntime(const MpiRuntime&) = delete;
  MpiRuntime& operator=(const MpiRuntime&) = delete;

  // Queues `task` for the MPI thread, behind every task submitted before it. It must not throw.
  void submit(std::function<void()> task);
  // Runs `task` on the MPI thread, waits for it and rethrows its exception; for set-up calls, which have no
  // deadline of their own.
  void run_sync(const std::function<void()>& task);

  // After a timeout the MPI thread may be blocked for good: exit must neither join it nor finalise MPI.
  void mark_stuck() { stuck_ = true; }

 private:
  MpiRuntime();
  // On the MPI thread, before any other MPI call.
  void initialise();

  TaskQueue tasks_;
  std::thread thread_;
  bool initialised_here_ = false;  // touched only by the MPI thread
  std::atomic<bool> stuck_{false};
};

}  // namespace tandem::comm
