#include "heartbeat_watch.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "tandem/util/error.h"

namespace tandem::launch {

HeartbeatWatch::HeartbeatWatch(Tick tick, std::chrono::milliseconds interval, std::chrono::milliseconds give_up_after,
                               Clock::time_point started)
    : tick_(std::move(tick)), interval_(interval), give_up_after_(give_up_after), answered_send_(started) {
  if (::pipe2(pipe_, O_CLOEXEC) != 0) {
    throw Error(fmt::format("cannot create the heartbeat watch's pipe: {}", std::strerror(errno)));
  }
  thread_ = std::thread([this] { run(); });
}

HeartbeatWatch::~HeartbeatWatch() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
  for (int fd : pipe_) ::close(fd);
}

std::optional<RoundEnd> HeartbeatWatch::ended() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return ended_;
}

std::string HeartbeatWatch::store_error() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return store_error_;
}

void HeartbeatWatch::finish() {
  finished_ = true;
  const char byte = 1;
  while (::write(pipe_[1], &byte, 1) < 0 && errno == EINTR) {
  }
}

void HeartbeatWatch::run() {
  while (true) {
    std::optional<RoundEnd> end;
    const Clock::time_point sent = Clock::now();
    try {
      end = tick_(answered_send_ + give_up_after_);
      answered_send_ = sent;
    } catch (const std::exception& error) {
      std::lock_guard<std::mutex> lock(mutex_);
      store_error_ = first_line(error.what());
    }
    std::unique_lock<std::mutex> lock(mutex_);
    if (end || !store_error_.empty()) {
      ended_ = end;
      lock.unlock();
      finish();
      return;
    }
    // Ticks are sent every interval, however long the answers took: the slack before give_up_after stays one
    // interval or more.
    if (wake_.wait_until(lock, sent + interval_, [this] { return stop_; })) return;
  }
}

}  // namespace tandem::launch
