#include "tandem/comm/collective_tracker.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>

#include "tandem/util/error.h"

namespace tandem::comm {
namespace {

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
  uint64_t published = 0;
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_signal_.wait_for(lock, std::chrono::milliseconds(200), [this] { return stopping_; })) {
    uint64_t now = issued_.load();
    if (now == published) continue;
    try {
      std::string text = std::to_string(now);
      store_->set(progress_key(rank_), std::vector<uint8_t>(text.begin(), text.end()));
      published = now;
    } catch (const std::exception&) {
      // The store lives in rank 0; once it is gone there is nobody left to tell.
      return;
    }
  }
}

std::string CollectiveTracker::laggards(uint64_t sequence) {
  std::vector<int> behind;
  try {
    for (int r = 0; r < world_size_; ++r) {
      if (r == rank_) continue;
      uint64_t reached = 0;
      if (store_->check({progress_key(r)})) {
        auto bytes = store_->get(progress_key(r));
        reached = std::stoull(std::string(bytes.begin(), bytes.end()));
      }
      if (reached < sequence) behind.push_back(r);
    }
  } catch (const std::exception&) {
    return "the rendezvous store in rank 0 is unreachable, so rank 0 has probably exited";
  }
  if (behind.empty()) return "every rank reached it";
  return fmt::format("rank(s) {} never reached it", describe_ranks(behind));
}

void CollectiveTracker::fail(const std::string& operation, uint64_t sequence, const std::string& backend_message,
                             std::chrono::milliseconds timeout) {
  std::string where = fmt::format("{} #{} on rank {}/{}", operation, sequence, rank_, world_size_);
  std::string cause = first_line(backend_message);
  if (mentions(backend_message, "timed out") || mentions(backend_message, "timeout")) {
    throw TimeoutError(fmt::format("{} timed out after {:.0f} s: {}; every rank must issue the same collectives "
                                   "in the same order ({})",
                                   where, timeout.count() / 1000.0, laggards(sequence), cause));
  }
  throw CommError(fmt::format("{} failed: {}; a peer process has probably exited, see its output ({})", where,
                              laggards(sequence), cause));
}

}  // namespace tandem::comm
