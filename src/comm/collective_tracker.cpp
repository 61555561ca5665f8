#include "tandem/comm/collective_tracker.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <condition_variable>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <vector>

#include "tandem/util/error.h"

namespace tandem::comm {
namespace {

// The number of diagnoses asked for so far: a failing rank adds one, and every rank's responder answers once it
// sees the number move.
const std::string kRequestsKey = "tandem/diagnosis/requests";
// Rank's answer: "<request answered> <collectives issued>" on the first line, then one "<sequence> <signature>"
// line per remembered collective, oldest first.
std::string answer_key(int rank) { return fmt::format("tandem/diagnosis/answer/{}", rank); }
// Under DETAIL: rank's signature of collective `sequence`, published before it starts.
std::string agreement_key(uint64_t sequence, int rank) { return fmt::format("tandem/agreement/{}/{}", sequence, rank); }

bool mentions(const std::string& text, const std::string& word) {
  std::string lower = text;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  return lower.find(word) != std::string::npos;
}


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
  // Guards the responder's life.
  std::mutex mutex;
  std::condition_variable changed;
  bool stopping = false;
  bool responder_done = false;
};

namespace {

void respond_loop(const std::shared_ptr<CollectiveTracker::Shared>& shared);

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
  responder_ = std::thread([shared = shared_] { respond_loop(shared); });
}

CollectiveTracker::~CollectiveTracker() {
  std::unique_lock<std::mutex> lock(shared_->mutex);
  shared_->stopping = true;
  shared_->changed.notify_all();
  // A responder stuck in a store call that never returns is left behind; it holds its own share of the state.
  const bool done = shared_->changed.wait_for(lock, kPoll, [this] { return shared_->responder_done; });
  lock.unlock();
  if (done) {
    responder_.join();
  } else {
    responder_.detach();
  }
}

uint64_t CollectiveTracker::begin(CollectiveSignature signature) {
  std::lock_guard<std::mutex> lock(shared_->issued_mutex);
  const uint64_t sequence = ++shared_->issued;
  shared_->remembered[sequence % kRemembered] = std::move(signature);
  return sequence;
}

namespace {

// This rank's answer to request `request` (see answer_key).
std::string answer_text(CollectiveTracker::Shared& shared, uint64_t request) {
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
  std::string text = fmt::format("{} {}\n", request, issued);
  for (const auto& [sequence, signature] : latest) text += fmt::format("{} {}\n", sequence, signature.describe());
  return text;
}

// Looks every kPoll for a new request and answers it; reads only, until some rank fails.
void respond_loop(const std::shared_ptr<CollectiveTracker::Shared>& shared) {
  uint64_t answered = 0;
  std::unique_lock<std::mutex> lock(shared->mutex);
  while (!shared->changed.wait_for(lock, CollectiveTracker::kPoll, [&] { return shared->stopping; })) {
    lock.unlock();
    try {
      if (shared->store->check({kRequestsKey})) {
        const uint64_t requested = std::stoull(store_text(shared->store->get(kRequestsKey)));
        if (requested != answered) {
          shared->store->set(answer_key(shared->rank), store_bytes(answer_text(*shared, requested)));
          answered = requested;
        }
      }
    } catch (const std::exception&) {
      // The store lives in rank 0 or the launcher; once it is gone there is nobody left to answer.
      lock.lock();
      break;
    }
    lock.lock();
  }
  shared->responder_done = true;
  shared->changed.notify_all();
}

// A rank's answer, read back: how many collectives it had issued, and its remembered signatures' lines.
struct Answer {
  uint64_t issued = 0;
  std::string lines;
};

// Asks every other rank for its answer and collects those that come within kAnswerWait, by rank; a rank missing
// from the result never answered.
std::map<int, Answer> ask_the_others(CollectiveTracker::Shared& shared) {
  const uint64_t request = static_cast<uint64_t>(shared.store->add(kRequestsKey, 1));
  std::map<int, Answer> answers;
  std::vector<int> waiting_for;
  for (int r = 0; r < shared.world_size; ++r) {
    if (r != shared.rank) waiting_for.push_back(r);
  }
  const auto give_up = std::chrono::steady_clock::now() + CollectiveTracker::kAnswerWait;
  // Most answers come within a poll; reading each rank's key again and again meanwhile would only load the store.
  auto pause = std::chrono::milliseconds(20);
  while (!waiting_for.empty()) {
    std::vector<int> still_waiting;
    for (int r : waiting_for) {
      const std::string key = answer_key(r);
      const std::string text = shared.store->check({key}) ? store_text(shared.store->get(key)) : "";
      const size_t space = text.find(' ');
      const size_t end_of_line = text.find('\n');
      // An answer to an earlier request is from before this failure; one to a later request (another rank's
      // failure) is newer still, and as good.
      if (space == std::string::npos || end_of_line == std::string::npos || std::stoull(text.substr(0, space)) < request) {
        still_waiting.push_back(r);
        continue;
      }
      answers[r] = {std::stoull(text.substr(space + 1, end_of_line - space - 1)), text.substr(end_of_line + 1)};
    }
    waiting_for = std::move(still_waiting);
    if (waiting_for.empty() || std::chrono::steady_clock::now() >= give_up) break;
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(200));
  }
  return answers;
}

// The signature of collective `sequence` among an answer's lines, or "" where the answer has none.
std::string signature_in(const std::string& lines, uint64_t sequence) {
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

constexpr const char* kStoreUnreachable =
    "the rendezvous store on rank 0 is unreachable, so rank 0 has exited or its host or network is down";

// What the other ranks answer, for the failure message of collective `sequence`.
std::string diagnose(CollectiveTracker::Shared& shared, uint64_t sequence) {
  std::map<int, Answer> answers;
  try {
    answers = ask_the_others(shared);
  } catch (const std::exception&) {
    return kStoreUnreachable;
  }
  // A lost rank explains the failure whatever it had issued: it may have issued the collective just before its
  // host went away.
  std::vector<int> lost;
  for (int r = 0; r < shared.world_size; ++r) {
    if (r != shared.rank && answers.count(r) == 0) lost.push_back(r);
  }
  if (!lost.empty()) {
    return fmt::format("lost rank(s) {}: no answer through the rendezvous store within {:.0f} s, so the process is "
                       "gone or its host or network is down",
                       describe_ranks(lost), CollectiveTracker::kAnswerWait.count() / 1000.0);
  }
  std::vector<int> behind;
  std::vector<std::string> signature_of(static_cast<size_t>(shared.world_size));
  const std::optional<CollectiveSignature> own_signature = remembered_signature(shared, sequence);
  for (const auto& [r, answer] : answers) {
    if (answer.issued < sequence) {
      behind.push_back(r);
    } else if (own_signature) {
      signature_of[static_cast<size_t>(r)] = signature_in(answer.lines, sequence);
    }
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
    shared.store->set(agreement_key(sequence, shared.rank), store_bytes(own_signature->describe()));
    std::vector<std::string> others;
    for (int r = 0; r < shared.world_size; ++r) {
      if (r != shared.rank) others.push_back(agreement_key(sequence, r));
    }
    shared.store->wait(others, timeout);
    for (int r = 0; r < shared.world_size; ++r) {
      if (r != shared.rank) signature_of[static_cast<size_t>(r)] = store_text(shared.store->get(agreement_key(sequence, r)));
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
