#include "tandem/comm/collective_tracker.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>

#include "tandem/util/error.h"

namespace tandem::comm {
namespace {

// Holds "<collectives issued> <tick>": the count for who reached what, the tick as a heartbeat.
std::string progress_key(int rank) { return fmt::format("tandem/progress/{}", rank); }

bool mentions(const std::string& text, const std::string& word) {
  std::string lower = text;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  return lower.find(word) != std::string::npos;
}

// Backend messages can run to many lines (c10 appends a C++ backtrace); the first line says what happened.
std::string first_line(const std::string& text) { return text.substr(0, text.find('\n')); }

}  // namespace

CollectiveTracker::CollectiveTracker(StorePtr store, int rank, int world_size)
    : store_(std::move(store)), rank_(rank), world_size_(world_size) {
  publisher_ = std::thread([this] { publish_loop(); });
}

CollectiveTracker::~CollectiveTracker() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  stop_signal_.notify_all();
  publisher_.join();
}

uint64_t CollectiveTracker::begin() { return ++issued_; }

void CollectiveTracker::publish_loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (uint64_t tick = 1; !stop_signal_.wait_for(lock, kTick, [this] { return stopping_; }); ++tick) {
    try {
      std::string text = fmt::format("{} {}", issued_.load(), tick);
      store_->set(progress_key(rank_), std::vector<uint8_t>(text.begin(), text.end()));
    } catch (const std::exception&) {
      // The store lives in rank 0; once it is gone there is nobody left to tell.
      return;
    }
  }
}

std::string CollectiveTracker::published(int rank) {
  if (!store_->check({progress_key(rank)})) return "";
  auto bytes = store_->get(progress_key(rank));
  return std::string(bytes.begin(), bytes.end());
}

std::vector<int> CollectiveTracker::silent_ranks() {
  std::vector<std::string> before(static_cast<size_t>(world_size_));
  for (int r = 0; r < world_size_; ++r) {
    if (r != rank_) before[static_cast<size_t>(r)] = published(r);
  }
  std::this_thread::sleep_for(kSilence);
  std::vector<int> silent;
  for (int r = 0; r < world_size_; ++r) {
    if (r != rank_ && published(r) == before[static_cast<size_t>(r)]) silent.push_back(r);
  }
  return silent;
}

std::string CollectiveTracker::diagnose(uint64_t sequence) {
  std::vector<int> behind;
  try {
    // A lost rank explains the failure whatever its count says: it may have issued the collective just before
    // its host went away.
    std::vector<int> lost = silent_ranks();
    if (!lost.empty()) {
      return fmt::format("lost rank(s) {}: no heartbeat in the rendezvous store for {:.0f} s, so the process is "
                         "gone or its host or network is down",
                         describe_ranks(lost), kSilence.count() / 1000.0);
    }
    for (int r = 0; r < world_size_; ++r) {
      if (r == rank_) continue;
      const std::string progress = published(r);
      const uint64_t reached = progress.empty() ? 0 : std::stoull(progress.substr(0, progress.find(' ')));
      if (reached < sequence) behind.push_back(r);
    }
  } catch (const std::exception&) {
    return "the rendezvous store on rank 0 is unreachable, so rank 0 has exited or its host or network is down";
  }
  if (behind.empty()) return "every rank reached it";
  return fmt::format("rank(s) {} never reached it; every rank must issue the same collectives in the same order",
                     describe_ranks(behind));
}

void CollectiveTracker::fail(const std::string& operation, uint64_t sequence, const std::string& backend_message,
                             std::chrono::milliseconds timeout) {
  std::string where = fmt::format("{} #{} on rank {}/{}", operation, sequence, rank_, world_size_);
  std::string cause = first_line(backend_message);
  if (mentions(backend_message, "timed out") || mentions(backend_message, "timeout")) {
    throw TimeoutError(fmt::format("{} timed out after {:.0f} s: {} ({})", where, timeout.count() / 1000.0,
                                   diagnose(sequence), cause));
  }
  throw CommError(fmt::format("{} failed: {}; see the other ranks' output ({})", where, diagnose(sequence), cause));
}

}  // namespace tandem::comm
