#include "mpi_work.h"

#include <fmt/format.h>

#include <condition_variable>
#include <exception>
#include <utility>

#include "tandem/util/error.h"

namespace tandem::comm {
namespace {

// Completion of one queued collective, shared between the MPI thread (which fills it) and the Work handle.
struct WorkState {
  std::mutex mutex;
  std::condition_variable done_signal;
  bool done = false;
  std::exception_ptr error;
  std::function<void()> observer;  // Work::observe_completion's, called once when done

  // On the MPI thread, once the collective has run.
  void finish() {
    std::function<void()> notify;
    {
      std::lock_guard<std::mutex> lock(mutex);
      done = true;
      notify = std::move(observer);
      done_signal.notify_all();
    }
    if (notify) notify();
  }
};

class MpiWork : public Work {
 public:
  MpiWork(std::shared_ptr<WorkState> state, std::shared_ptr<MpiGroup> group, std::shared_ptr<MpiRuntime> runtime,
          std::string operation, std::chrono::milliseconds timeout)
      : state_(std::move(state)),
        group_(std::move(group)),
        runtime_(std::move(runtime)),
        operation_(std::move(operation)),
        deadline_(std::chrono::steady_clock::now() + timeout) {}

  void wait() override {
    std::unique_lock<std::mutex> lock(state_->mutex);
    if (!state_->done_signal.wait_until(lock, deadline_, [this] { return state_->done; })) {
      group_->set_broken(operation_ + " did not complete by its deadline");
      runtime_->mark_stuck();
      // The base words the timeout and names the ranks that never arrived.
      throw TimeoutError("MPI timed out in the collective, and MPI cannot cancel it; this communicator is unusable");
    }
    if (state_->error) std::rethrow_exception(state_->error);
  }

  bool is_completed() override {
    std::lock_guard<std::mutex> lock(state_->mutex);
    return state_->done;
  }

  void observe_completion(std::function<void()> observer) override {
    {
      std::lock_guard<std::mutex> lock(state_->mutex);
      if (!state_->done) {
        state_->observer = std::move(observer);
        return;
      }
    }
    observer();
  }

 private:
  std::shared_ptr<WorkState> state_;
  std::shared_ptr<MpiGroup> group_;
  std::shared_ptr<MpiRuntime> runtime_;
  std::string operation_;
  std::chrono::steady_clock::time_point deadline_;
};

}  // namespace

std::string MpiGroup::broken() {
  std::lock_guard<std::mutex> lock(mutex_);
  return broken_reason_;
}

void MpiGroup::set_broken(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (broken_reason_.empty()) broken_reason_ = reason;
}

WorkPtr start_on_mpi_thread(const std::shared_ptr<MpiRuntime>& runtime, const std::shared_ptr<MpiGroup>& group,
                            std::chrono::milliseconds timeout, const std::string& operation,
                            std::function<void(MPI_Comm)> body) {
  if (std::string reason = group->broken(); !reason.empty()) {
    throw CommError(fmt::format("{} refused: the mpi communicator is unusable after an earlier failure ({})", operation,
                                reason));
  }
  auto state = std::make_shared<WorkState>();
  runtime->submit([state, group, operation, body = std::move(body)] {
    try {
      if (std::string reason = group->broken(); !reason.empty()) {
        throw CommError(fmt::format("{} was not run: the mpi communicator failed earlier ({})", operation, reason));
      }
      body(group->comm);
    } catch (...) {
      state->error = std::current_exception();
    }
    state->finish();
  });
  return std::make_shared<MpiWork>(state, group, runtime, operation, timeout);
}

}  // namespace tandem::comm
