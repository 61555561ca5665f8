#include "tandem/comm/collective_tracker.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <condition_variable>
#include <future>
#include <mutex>
#include <optional>
#include <vector>

#include "tandem/util/error.h"

namespace tandem::comm {
namespace {

// Holds "<collectives issued> <tick>": the count for who reached what, the tick as a heartbeat.
std::string progress_key(int rank) { return fmt::format("tandem/progress/{}", rank); }
// Holds one "<sequence> <signature>" line per remembered collective, oldest first.
std::string signatures_key(int rank) { return fmt::format("tandem/signatures/{}", rank); }
// Under DETAIL: rank's signature of collective `sequence`, published before it starts.
std::string agreement_key(uint64_t sequence, int rank) { return fmt::format("tandem/agreement/{}/{}", sequence, rank); }

bool mentions(const std::string& text, const std::string& word) {
  std::string lower = text;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  return lower.find(word) != std::string::npos;
}

std::string as_text(const std::vector<uint8_t>& bytes) { return std::string(bytes.begin(), bytes.end()); }
std::vector<uint8_t> as_bytes(const std::string& text) { return std::vector<uint8_t>(text.begin(), text.end()); }

// "collective #7 differs across ranks: rank 0 in all_reduce(avg) float32[60], rank 1 in barrier", or "" where
// the known signatures (non-empty entries of `signature_of`, one per rank) agree.
std::string differing_collectives(uint64_t sequence, const std::vector<std::string>& signature_of) {
  std::vector<std::pair<std::string, std::vector<int>>> groups;
  for (int r = 0; r < static_cast<int>(signature_of.size()); ++r) {
    const std::string& signature = signature_of[static_cast<size_t>(r)];
    if (signature.empty()) continue;
    auto group = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == signature; });
    if (group == groups.end()) group = groups.insert(groups.end(), {signature, {}});
    group->second.push_back(r);
  }
  if (groups.size() < 2) return "";
  std::string text = fmt::format("collective #{} differs across ranks: ", sequence);
  for (size_t g = 0; g < groups.size(); ++g) {
    const auto& [signature, ranks] = groups[g];
    text += fmt::format("{}{} {} in {}", g == 0 ? "" : ", ", ranks.size() == 1 ? "rank" : "ranks",
                        describe_ranks(ranks), signature);
  }
  return text;
}

constexpr const char* kSameOrder = "every rank must issue the same collectives in the same order";

}  // namespace

struct CollectiveTracker::Shared {
  StorePtr store;
  int rank;
  int world_size;
  // Guards issued and remembered, which begin() writes on the caller's thread.
  std::mutex issued_mutex;
  uint64_t issued = 0;
  // Collective n's signature, at n % kRemembered.
  std::array<CollectiveSignature, kRemembered> remembered;
  // Guards the publisher's life.
  std::mutex mutex;
  std::condition_variable changed;
  bool stopping = false;
  bool publisher_done = false;
};

namespace {

void publish_loop(const std::shared_ptr<CollectiveTracker::Shared>& shared);

// This rank's signature of collective `sequence`, if it still remembers it.
std::optional<CollectiveSignature> remembered_signature(CollectiveTracker::Shared& shared, uint64_t sequence) {
  std::lock_guard<std::mutex> lock(shared.issued_mutex);
  if (sequence == 0 || sequence > shared.issued || shared.issued - sequence >= CollectiveTracker::kRemembered) {
    return std::nullopt;
  }
  return shared.remembered[sequence % CollectiveTracker::kRemembered];
}

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

uint64_t CollectiveTracker::begin(CollectiveSignature signature) {
  std::lock_guard<std::mutex> lock(shared_->issued_mutex);
  const uint64_t sequence = ++shared_->issued;
  shared_->remembered[sequence % kRemembered] = std::move(signature);
  return sequence;
}

namespace {

// The remembered signatures as published, and the count they end at.
std::pair<std::string, uint64_t> remembered_lines(CollectiveTracker::Shared& shared) {
  std::vector<std::pair<uint64_t, CollectiveSignature>> latest;
  uint64_t issued = 0;
  {
    std::lock_guard<std::mutex> lock(shared.issued_mutex);
    issued = shared.issued;
    const uint64_t first = issued >= CollectiveTracker::kRemembered ? issued - CollectiveTracker::kRemembered + 1 : 1;
    for (uint64_t n = first; n <= issued; ++n) {
      latest.emplace_back(n, shared.remembered[n % CollectiveTracker::kRemembered]);
    }
  }
  std::string text;
  for (const auto& [sequence, signature] : latest) text += fmt::format("{} {}\n", sequence, signature.describe());
  return {text, issued};
}

void publish_loop(const std::shared_ptr<CollectiveTracker::Shared>& shared) {
  uint64_t signatures_published_at = 0;
  std::unique_lock<std::mutex> lock(shared->mutex);
  for (uint64_t tick = 1;
       !shared->changed.wait_for(lock, CollectiveTracker::kTick, [&] { return shared->stopping; }); ++tick) {
    lock.unlock();
    try {
      // The signatures first: a reader that sees a count in the progress finds that collective's signature.
      auto [signatures, issued] = remembered_lines(*shared);
      if (issued != signatures_published_at) {
        shared->store->set(signatures_key(shared->rank), as_bytes(signatures));
        signatures_published_at = issued;
      }
      shared->store->set(progress_key(shared->rank), as_bytes(fmt::format("{} {}", issued, tick)));
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

// The value of `key`, or "" before it is first set.
std::string published(const CollectiveTracker::Shared& shared, const std::string& key) {
  if (!shared.store->check({key})) return "";
  return as_text(shared.store->get(key));
}

// Rank r's published signature of collective `sequence`, or "" where it published none.
std::string published_signature(const CollectiveTracker::Shared& shared, int rank, uint64_t sequence) {
  const std::string lines = published(shared, signatures_key(rank));
  const std::string prefix = fmt::format("{} ", sequence);
  for (size_t start = 0; start < lines.size();) {
    const size_t end = std::min(lines.find('\n', start), lines.size());
    if (lines.compare(start, prefix.size(), prefix) == 0) {
      return lines.substr(start + prefix.size(), end - start - prefix.size());
    }
    start = end + 1;
  }
  return "";
}

// Ranks whose published progress stands still for kSilence.
std::vector<int> silent_ranks(const CollectiveTracker::Shared& shared) {
  std::vector<std::string> before(static_cast<size_t>(shared.world_size));
  for (int r = 0; r < shared.world_size; ++r) {
    if (r != shared.rank) before[static_cast<size_t>(r)] = published(shared, progress_key(r));
  }
  std::this_thread::sleep_for(CollectiveTracker::kSilence);
  std::vector<int> silent;
  for (int r = 0; r < shared.world_size; ++r) {
    if (r != shared.rank && published(shared, progress_key(r)) == before[static_cast<size_t>(r)]) silent.push_back(r);
  }
  return silent;
}

constexpr const char* kStoreUnreachable =
    "the rendezvous store on rank 0 is unreachable, so rank 0 has exited or its host or network is down";

// What the store says about the other ranks, for the failure message of collective `sequence`.
std::string diagnose(CollectiveTracker::Shared& shared, uint64_t sequence) {
  std::vector<int> behind;
  std::vector<std::string> signature_of(static_cast<size_t>(shared.world_size));
  const std::optional<CollectiveSignature> own_signature = remembered_signature(shared, sequence);
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
      const std::string progress = published(shared, progress_key(r));
      const uint64_t reached = progress.empty() ? 0 : std::stoull(progress.substr(0, progress.find(' ')));
      if (reached < sequence) {
        behind.push_back(r);
      } else if (own_signature) {
        signature_of[static_cast<size_t>(r)] = published_signature(shared, r, sequence);
      }
    }
  } catch (const std::exception&) {
    return kStoreUnreachable;
  }
  if (own_signature) signature_of[static_cast<size_t>(shared.rank)] = own_signature->describe();
  const std::string differing = differing_collectives(sequence, signature_of);
  const std::string never_reached =
      behind.empty() ? "" : fmt::format("rank(s) {} never reached it", describe_ranks(behind));
  if (!differing.empty()) {
    return fmt::format("{}{}; {}", differing, never_reached.empty() ? "" : "; " + never_reached, kSameOrder);
  }
  if (!never_reached.empty()) return fmt::format("{}; {}", never_reached, kSameOrder);
  return "every rank reached it";
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

void CollectiveTracker::agree(uint64_t sequence, std::chrono::milliseconds timeout) {
  const std::optional<CollectiveSignature> own_signature = remembered_signature(*shared_, sequence);
  TANDEM_CHECK(own_signature.has_value(), "agree() on collective ", sequence, ", which this rank has not issued");
  Shared& shared = *shared_;
  std::vector<std::string> signature_of(static_cast<size_t>(shared.world_size));
  signature_of[static_cast<size_t>(shared.rank)] = own_signature->describe();
  try {
    shared.store->set(agreement_key(sequence, shared.rank), as_bytes(own_signature->describe()));
    std::vector<std::string> others;
    for (int r = 0; r < shared.world_size; ++r) {
      if (r != shared.rank) others.push_back(agreement_key(sequence, r));
    }
    shared.store->wait(others, timeout);
    for (int r = 0; r < shared.world_size; ++r) {
      if (r != shared.rank) signature_of[static_cast<size_t>(r)] = as_text(shared.store->get(agreement_key(sequence, r)));
    }
    // Every rank has published collective `sequence`'s signature, so each has read every signature of the one
    // before: nobody reads this rank's old one any more.
    if (sequence > 1) shared.store->deleteKey(agreement_key(sequence - 1, shared.rank));
  } catch (const std::exception& error) {
    // A rank that reached the collective without publishing lacks the debug option itself.
    fail(own_signature->kind, sequence,
         fmt::format("TANDEM_DISTRIBUTED_DEBUG=DETAIL, which every rank must set, waited for every rank's signature: {}",
                     error.what()),
         timeout);
  }
  const std::string differing = differing_collectives(sequence, signature_of);
  if (!differing.empty()) {
    throw CommError(fmt::format("{}; {} (found on rank {}/{} before the collective started)", differing, kSameOrder,
                                shared.rank, shared.world_size));
  }
}

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
