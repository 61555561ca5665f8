#include "tandem/comm/rendezvous.h"

#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <c10/util/Logging.h>
#include <unistd.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <thread>

#include "tandem/comm/launcher_file_store.h"
#include "tandem/comm/store_probe.h"
#include "tandem/util/call_within.h"
#include "tandem/util/error.h"

namespace tandem::comm {
namespace {

std::string join_key(int rank) { return fmt::format("tandem/join/{}", rank); }

// Set by rank 0 when the join times out: the ranks that never came, for the ranks that did.
const std::string kTimedOutKey = "tandem/join/timed_out";
const std::string kTimedOutAcksKey = "tandem/join/timed_out/acks";
constexpr std::chrono::seconds kTimedOutLinger{2};


double seconds(std::chrono::milliseconds duration) { return duration.count() / 1000.0; }

// Keeps c10d's warnings off the terminal while it lives. A TCPStore client logs every failed attempt to reach
// its server (an unresolvable MASTER_ADDR, a rank 0 not up yet) at WARNING, about one a second until the
// timeout; the CommError thrown at the end says once what failed. c10d's log level is c10's caffe2_log_level
// (c10d/logging.h) in every LibTorch tandem builds on.
class QuietC10dWarnings {
 public:
  QuietC10dWarnings() : saved_(FLAGS_caffe2_log_level) { FLAGS_caffe2_log_level = std::max(saved_, kAboveError); }
  ~QuietC10dWarnings() { FLAGS_caffe2_log_level = saved_; }
  QuietC10dWarnings(const QuietC10dWarnings&) = delete;
  QuietC10dWarnings& operator=(const QuietC10dWarnings&) = delete;

 private:
  static constexpr int kAboveError = 3;  // c10's FATAL: c10d logs nothing at that level
  int saved_;
};

constexpr const char* kNameTheStore =
    "check that MASTER_ADDR and MASTER_PORT name rank 0's rendezvous store (or tandem run's), not another service";

// What a rank says when something at the store's address accepted its connection and never answered.
CommError no_answer_at_the_store(int rank, std::chrono::milliseconds timeout) {
  return CommError(fmt::format("rank {} connected to the rendezvous store's address but got no answer within {:.0f} s: "
                               "what listens there is no store; {}",
                               rank, seconds(timeout), kNameTheStore));
}

// A client of the TCPStore at host for `rank`. The address is probed first (store_probe.h): c10d's client must not
// meet another service, whose bytes LibTorch 1.13 reads as a length and dies of std::bad_alloc; a port that
// accepts connections and never answers is said within the timeout; and a name that the resolver definitely does
// not know is said at once (c10d would retry it, logging each try, past the timeout on 2.x). Nothing listening
// yet is no verdict while time is left: rank 0 may not be up, and c10d's client retries until the timeout. The
// client is then made on a thread of its own (call_within), as LibTorch 2.x's constructor pings its server without
// a deadline; past the timeout, and a second's grace so that c10d's own connect failure is the one reported, it is
// left waiting.
StorePtr connect_client(const std::string& host, const c10d::TCPStoreOptions& options, int rank) {
  const auto timeout = std::chrono::duration_cast<std::chrono::milliseconds>(options.timeout);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const StoreProbe probe = probe_store(host, options.port, timeout);
  switch (probe.verdict) {
    case StoreProbe::Verdict::kStore:
      break;
    case StoreProbe::Verdict::kNoConnection:
      if (std::chrono::steady_clock::now() >= deadline) throw std::runtime_error(probe.why);
      break;
    case StoreProbe::Verdict::kNoSuchHost:
      throw std::runtime_error(probe.why);
    case StoreProbe::Verdict::kSilent:
      throw no_answer_at_the_store(rank, timeout);
    case StoreProbe::Verdict::kNotAStore:
      throw CommError(fmt::format("rank {} found no rendezvous store at {}:{}: {}; {}", rank, host, options.port,
                                  probe.why, kNameTheStore));
  }
  std::optional<StorePtr> store =
      call_within(options.timeout + std::chrono::seconds(1),
                  [host, options]() -> StorePtr { return c10::make_intrusive<c10d::TCPStore>(host, options); });
  if (!store) throw no_answer_at_the_store(rank, timeout);
  return *store;
}

// Rank 0 hosts the store, unless the launcher does (launcher_serves) and every rank connects to it.
StorePtr make_tcp_store(const std::string& host, int port, bool launcher_serves, const RankLayout& layout,
                        std::chrono::milliseconds timeout) {
  const bool serve = layout.rank == 0 && !launcher_serves;
  c10d::TCPStoreOptions options;
  options.port = static_cast<uint16_t>(port);
  options.isServer = serve;
  options.numWorkers = layout.world_size;
  // join() waits for the workers itself, so that a missing rank is named instead of reported as a bare timeout.
  options.waitWorkers = false;
  options.timeout = timeout;
  try {
    const QuietC10dWarnings quiet;
    if (!serve) return connect_client(host, options, layout.rank);
    return c10::make_intrusive<c10d::TCPStore>(host, options);
  } catch (const CommError&) {
    throw;
  } catch (const std::exception& error) {
    if (serve) {
      // Ranks that srun started have no launcher to pass a port to; their port comes from the environment.
      const std::string remedy = layout.source == "slurm"
                                     ? "export another MASTER_PORT in the batch script"
                                     : "pick a free `master_port` or pass 0 to `tandem run` to choose one";
      throw CommError(fmt::format("rank 0 could not open the rendezvous port {}:{} ({}); is another job using it? {}",
                                  host, port, error.what(), remedy));
    }
    throw CommError(fmt::format(
        "rank {} could not reach the rendezvous master at {}:{} within {:.0f} s ({}); check that {} is "
        "running and MASTER_ADDR/MASTER_PORT match on every rank",
        layout.rank, host, port, seconds(timeout), error.what(), launcher_serves ? "the launcher" : "rank 0"));
  }
}

StorePtr make_file_store(const std::string& path, const RankLayout& layout, std::chrono::milliseconds timeout) {
  try {
    auto store = c10::make_intrusive<c10d::FileStore>(path, layout.world_size);
    store->setTimeout(timeout);
    return store;
  } catch (const std::exception& error) {
    throw CommError(fmt::format("cannot open the rendezvous file '{}': {}", path, error.what()));
  }
}

}  // namespace

std::string describe_ranks(const std::vector<int>& ranks) {
  std::string text;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!text.empty()) text += ", ";
    text += j > i + 1 ? fmt::format("{}-{}", ranks[i], ranks[j]) : fmt::format("{}", ranks[i]);
    if (j == i + 1) text += fmt::format(", {}", ranks[j]);
    i = j + 1;
  }
  return text;
}

StorePtr attempt_keys(const StorePtr& store, int restart_count) {
  return c10::make_intrusive<c10d::PrefixStore>(fmt::format("/worker/attempt_{}", restart_count), store);
}

StorePtr make_store(const std::string& init_method, const RankLayout& layout, std::chrono::milliseconds timeout) {
  if (init_method == "env://") {
    if (!layout.store_file.empty()) return open_launcher_file_store(layout.store_file, layout.world_size, timeout);
    StorePtr store =
        make_tcp_store(layout.master_addr, layout.master_port, layout.launcher_serves_store, layout, timeout);
    // The launcher's store outlives its attempts; PyTorch's env:// names each attempt's keys the same way.
    if (!layout.launcher_serves_store) return store;
    return attempt_keys(store, layout.restart_count);
  }
  const std::string tcp = "tcp://";
  const std::string file = "file://";
  if (init_method.rfind(tcp, 0) == 0) {
    std::string address = init_method.substr(tcp.size());
    size_t colon = address.rfind(':');
    if (colon == std::string::npos) {
      throw InvalidArgument(fmt::format("init method '{}' needs a port: tcp://HOST:PORT", init_method));
    }
    int port = 0;
    try {
      port = std::stoi(address.substr(colon + 1));
    } catch (const std::exception&) {
      throw InvalidArgument(fmt::format("init method '{}' has no valid port: tcp://HOST:PORT", init_method));
    }
    // The launcher's store is the one at MASTER_ADDR:MASTER_PORT; an address given here names rank 0's.
    return make_tcp_store(address.substr(0, colon), port, false, layout, timeout);
  }
  if (init_method.rfind(file, 0) == 0) {
    std::string path = init_method.substr(file.size());
    if (path.empty()) throw InvalidArgument("init method 'file://' needs a path: file:///shared/dir/store");
    return make_file_store(path, layout, timeout);
  }
  throw InvalidArgument(
      fmt::format("unknown init method '{}': use env://, tcp://HOST:PORT or file:///PATH", init_method));
}

namespace {

// Claims that a process at the store's address can bear: one per process given the rank, so any more is an
// answer of something that is not a c10d store.
constexpr int64_t kMostClaims = 1 << 20;

// Claims `rank` in the store and returns its claims so far, 1 unless another process was given the rank: the
// first request of a rank, so the one that finds out whether the store's address holds a store at all (a FileStore,
// or a TCP store the probe could not reach yet). The TCPStore client of LibTorch 1.13 waits for an answer without a
// deadline, and a port where something accepts connections but never answers hung the rank whatever its timeout;
// so the request runs on a thread of its own (call_within), which holds the store, and past `timeout` the rank
// fails and leaves that thread waiting.
int64_t claim_rank(const StorePtr& store, int rank, std::chrono::milliseconds timeout) {
  std::optional<int64_t> claims;
  try {
    claims = call_within(timeout, [store, key = join_key(rank) + "/claims"] { return store->add(key, 1); });
  } catch (const CommError&) {
    throw;  // the store's own account (a full TMPDIR: launcher_file_store.h)
  } catch (const std::exception& error) {
    throw CommError(fmt::format("rank {}'s first request to the rendezvous store failed ({}); {}", rank, error.what(),
                                kNameTheStore));
  }
  if (!claims) throw no_answer_at_the_store(rank, timeout);
  const int64_t count = *claims;
  if (count < 1 || count > kMostClaims) {
    throw CommError(fmt::format("rank {}'s first request to the rendezvous store got an answer no store gives (a "
                                "count of {} claims to the rank); {}",
                                rank, count, kNameTheStore));
  }
  return count;
}

}  // namespace

void join(const StorePtr& store_ptr, int rank, int world_size, std::chrono::milliseconds timeout) {
  c10d::Store& store = *store_ptr;
  std::string me = join_key(rank);
  // add() is atomic, so two processes given the same rank cannot both believe they are first.
  const int64_t claims = claim_rank(store_ptr, rank, timeout);
  if (claims > 1) {
    throw InvalidArgument(fmt::format("rank {} was claimed by {} processes; give each process a distinct RANK (0..{}), "
                                      "and each job its own MASTER_PORT (another job's store holds its own ranks)",
                                      rank, claims, world_size - 1));
  }
  std::string identity = fmt::format("{} {}", world_size, ::getpid());
  store.set(me, store_bytes(identity));

  const auto timed_out = [&](const std::string& missing_ranks) {
    return TimeoutError(fmt::format(
        "rendezvous timed out after {:.0f} s on rank {}: rank(s) {} of {} never joined; start every rank, "
        "with the same WORLD_SIZE and master address, or raise the timeout",
        seconds(timeout), rank, missing_ranks, world_size));
  };
  auto deadline = std::chrono::steady_clock::now() + timeout;
  std::vector<int> missing;
  try {
    for (auto pause = std::chrono::milliseconds(1);; pause = std::min(pause * 2, std::chrono::milliseconds(100))) {
      missing.clear();
      for (int r = 0; r < world_size; ++r) {
        if (!store.check({join_key(r)})) missing.push_back(r);
      }
      if (missing.empty()) break;
      // Rank 0 hosts the store and gives up first when it started first; the others learn from it which ranks
      // were missing, rather than from a connection that broke under them.
      if (rank != 0 && store.check({kTimedOutKey})) {
        std::string missing_ranks = store_text(store.get(kTimedOutKey));
        store.add(kTimedOutAcksKey, 1);
        throw timed_out(missing_ranks);
      }
      if (std::chrono::steady_clock::now() >= deadline) {
        std::string missing_ranks = describe_ranks(missing);
        if (rank == 0) {
          store.set(kTimedOutKey, store_bytes(missing_ranks));
          // Keep the store up until the ranks that joined have read why (bounded: some may have left already).
          const int joined_others = world_size - static_cast<int>(missing.size()) - 1;
          const auto linger_until = std::chrono::steady_clock::now() + kTimedOutLinger;
          while (store.add(kTimedOutAcksKey, 0) < joined_others && std::chrono::steady_clock::now() < linger_until) {
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
          }
        } else {
          store.add(kTimedOutAcksKey, 1);
        }
        throw timed_out(missing_ranks);
      }
      std::this_thread::sleep_for(pause);
    }
  } catch (const Error&) {
    throw;
  } catch (const std::exception& error) {
    throw CommError(fmt::format(
        "rank {} lost the rendezvous store on rank 0 while waiting for rank(s) {} of {} ({}); rank 0 probably "
        "failed: see its output",
        rank, describe_ranks(missing), world_size, error.what()));
  }
  for (int r = 0; r < world_size; ++r) {
    std::string value = store_text(store.get(join_key(r)));
    int their_world = std::stoi(value.substr(0, value.find(' ')));
    if (their_world != world_size) {
      throw InvalidArgument(fmt::format("world size mismatch: rank {} says {}, rank {} says {}; start every rank "
                                        "with the same WORLD_SIZE",
                                        rank, world_size, r, their_world));
    }
  }
}

}  // namespace tandem::comm
