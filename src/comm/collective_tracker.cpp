#include "tandem/comm/collective_tracker.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <future>

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

struct CollectiveTracker::Shared {
  StorePtr store;
  int rank;
  int world_size;
  std::atomic<uint64_t> issued{0};
  std::mutex mutex;
  std::condition_variable changed;
  bool stopping = false;
  bool publisher_done = false;
};

namespace {

void publish_loop(const std::shared_ptr<CollectiveTracker::Shared>& shared);

}  // namespace

CollectiveTracker::CollectiveTracker(StorePtr store, int rank, int world_size)
    : shared_(std::make_shared<Shared>()) {
  shared_->store = std::move(store);
  shared_->rank = rank;
  shared_->world_size = world_size;
  publisher_ = std::thread([shared = shared_] { publish_loop(shared); });
}

CollectiveTracker::~CollectiveTracker() {
  std::unique_lock<std::mutex> lock(shared_->mutex);
  shared_->stopping = true;
  shared_->changed.notify_all();
  // A publisher stuck in a store call that never returns is left behind; it holds its own share of the state.
  const bool done = shared_->changed.wait_for(lock, 5 * kTick, [this] { return shared_->publisher_done; });
  lock.unlock();
  if (done) {
    publisher_.join();
  } else {
    publisher_.detach();
  }
}

uint64_t CollectiveTracker::begin() { return ++shared_->issued; }

namespace {

void publish_loop(const std::shared_ptr<CollectiveTracker::Shared>& shared) {
  std::unique_lock<std::mutex> lock(shared->mutex);
  for (uint64_t tick = 1;
       !shared->changed.wait_for(lock, CollectiveTracker::kTick, [&] { return shared->stopping; }); ++tick) {
    const std::string text = fmt::format("{} {}", shared->issued.load(), tick);
    lock.unlock();
    try {
      shared->store->set(progress_key(shared->rank), std::vector<uint8_t>(text.begin(), text.end()));
    } catch (const std::exception&) {
      // The store lives in rank 0; once it is gone there is nobody left to tell.
      lock.lock();
      break;
    }
    lock.lock();
  }
  shared->publisher_done = true;
  shared->changed.notify_all();
}

// Rank r's last published "<count> <tick>", or "" before its first.
std::string published(const CollectiveTracker::Shared& shared, int rank) {
  if (!shared.store->check({progress_key(rank)})) return "";
  auto bytes = shared.store->get(progress_key(rank));
  return std::string(bytes.begin(), bytes.end());
}

// Ranks whose published value stands still for kSilence.
std::vector<int> silent_ranks(const CollectiveTracker::Shared& shared) {
  std::vector<std::string> before(static_cast<size_t>(shared.world_size));
  for (int r = 0; r < shared.world_size; ++r) {
    if (r != shared.rank) before[static_cast<size_t>(r)] = published(shared, r);
  }
  std::this_thread::sleep_for(CollectiveTracker::kSilence);
  std::vector<int> silent;
  for (int r = 0; r < shared.world_size; ++r) {
    if (r != shared.rank && published(shared, r) == before[static_cast<size_t>(r)]) silent.push_back(r);
  }
  return silent;
}

constexpr const char* kStoreUnreachable =
    "the rendezvous store on rank 0 is unreachable, so rank 0 has exited or its host or network is down";

// What the store says about the other ranks, for the failure message of collective `sequence`.
std::string diagnose(const CollectiveTracker::Shared& shared, uint64_t sequence) {
  std::vector<int> behind;
  try {
    // A lost rank explains the failure whatever its count says: it may have issued the collective just before
    // its host went away.
    std::vector<int> lost = silent_ranks(shared);
    if (!lost.empty()) {
      return fmt::format("lost rank(s) {}: no heartbeat in the rendezvous store for {:.0f} s, so the process is "
                         "gone or its host or network is down",
                         describe_ranks(lost), CollectiveTracker::kSilence.count() / 1000.0);
    }
    for (int r = 0; r < shared.world_size; ++r) {
      if (r == shared.rank) continue;
      const std::string progress = published(shared, r);
      const uint64_t reached = progress.empty() ? 0 : std::stoull(progress.substr(0, progress.find(' ')));
      if (reached < sequence) behind.push_back(r);
    }
  } catch (const std::exception&) {
    return kStoreUnreachable;
  }
  if (behind.empty()) return "every rank reached it";
  return fmt::format("rank(s) {} never reached it; every rank must issue the same collectives in the same order",
                     describe_ranks(behind));
}

// diagnose() on its own thread, given up after kDiagnosisDeadline: a store whose host is gone may never answer.
std::string diagnose_within_deadline(const std::shared_ptr<CollectiveTracker::Shared>& shared, uint64_t sequence) {
  auto answer = std::make_shared<std::promise<std::string>>();
  std::future<std::string> diagnosis = answer->get_future();
  std::thread([shared, answer, sequence] { answer->set_value(diagnose(*shared, sequence)); }).detach();
  if (diagnosis.wait_for(CollectiveTracker::kDiagnosisDeadline) != std::future_status::ready) return kStoreUnreachable;
  return diagnosis.get();
}

}  // namespace

void CollectiveTracker::fail(const std::string& operation, uint64_t sequence, const std::string& backend_message,
                             std::chrono::milliseconds timeout) {
  std::string where = fmt::format("{} #{} on rank {}/{}", operation, sequence, shared_->rank, shared_->world_size);
  std::string cause = first_line(backend_message);
  if (mentions(backend_message, "timed out") || mentions(backend_message, "timeout")) {
    throw TimeoutError(fmt::format("{} timed out after {:.0f} s: {} ({})", where, timeout.count() / 1000.0,
                                   diagnose_within_deadline(shared_, sequence), cause));
  }
  throw CommError(fmt::format("{} failed: {}; see the other ranks' output ({})", where,
                              diagnose_within_deadline(shared_, sequence), cause));
}

}  // namespace tandem::comm
