#include "tandem/launch/agent_store.h"

#include <fmt/format.h>
#include <netdb.h>
#include <sys/socket.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <unistd.h>

#include <cerrno>
#include <memory>
#include <optional>
#include <stdexcept>
#include <thread>

#include "tandem/comm/store_probe.h"
#include "tandem/util/call_within.h"
#include "tandem/util/compat.h"
#include "tandem/util/error.h"

namespace tandem::launch {
namespace {

using Clock = std::chrono::steady_clock;

// Between tries to reach the store: short against join_timeout, long enough not to hammer a host coming up.
constexpr std::chrono::milliseconds kConnectPause{200};
// A key every connection reads once, so that c10d applies the operation timeout to the connection's socket.
const std::string kConnectedKey = "/tandem_agents/connections";

using AddressList = std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)>;

AddressList resolve_endpoint(const std::string& host, int port, int flags) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = flags;
  addrinfo* found = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) found = nullptr;
  return AddressList(found, ::freeaddrinfo);
}

// A socket bound to host:port and listening, or -1 (errno set) where host is not local or the port is taken.
int bind_endpoint(const std::string& host, int port) {
  AddressList addresses = resolve_endpoint(host, port, AI_NUMERICSERV);
  errno = EADDRNOTAVAIL;
  for (const addrinfo* address = addresses.get(); address != nullptr; address = address->ai_next) {
    const int fd = ::socket(address->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    const int on = 1;
    // A store of this host's earlier job may leave the port in TIME_WAIT; that is no agent of this job.
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
    if (::bind(fd, address->ai_addr, address->ai_addrlen) == 0 && ::listen(fd, SOMAXCONN) == 0) return fd;
    const int error = errno;
    ::close(fd);
    errno = error;
    if (error == EADDRINUSE) return -1;
  }
  return -1;
}

// A try that found another service at the endpoint: evidence that outweighs a later try's silence (a service that
// greets late says nothing within a try cut short by join_timeout), so the agent's last word names it.
class AnotherService : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A client of the store at host:port, connected and answering, within `timeout` in all; throws
// std::runtime_error saying why not, or returns null once `interrupted` said yes. The probe comes first: c10d's
// client must never meet a peer that is no store (store_probe.h), and TCPStore's own connect logs an error line
// for every try that fails. Both run on a thread of their own (call_within), so that a Ctrl-C is heard while they
// wait: LibTorch 2.x's client constructor pings the store and waits for the answer without a deadline.
c10::intrusive_ptr<c10d::Store> connect_once(const std::string& host, int port, std::chrono::milliseconds timeout,
                                             const std::function<bool()>& interrupted) {
  std::optional<c10::intrusive_ptr<c10d::Store>> connected = call_within(
      timeout,
      [host, port, timeout]() -> c10::intrusive_ptr<c10d::Store> {
        const comm::StoreProbe probe = comm::probe_store(host, port, timeout);
        if (probe.verdict == comm::StoreProbe::Verdict::kNotAStore) throw AnotherService(probe.why);
        if (probe.verdict != comm::StoreProbe::Verdict::kStore) throw std::runtime_error(probe.why);
        c10d::TCPStoreOptions options;
        options.port = static_cast<uint16_t>(port);
        options.isServer = false;
        options.waitWorkers = false;
        options.timeout = timeout;
        auto store = c10::make_intrusive<c10d::TCPStore>(host, options);
        store->add(kConnectedKey, 1);
        store->wait({kConnectedKey}, options.timeout);
        return store;
      },
      interrupted);
  if (connected) return *connected;
  if (interrupted()) return {};
  throw std::runtime_error(
      fmt::format("it accepted the connection but did not answer within {:.1f} s", timeout.count() / 1000.0));
}

}  // namespace

bool is_local_address(const std::string& host) {
  AddressList addresses = resolve_endpoint(host, 0, AI_NUMERICSERV);
  for (const addrinfo* address = addresses.get(); address != nullptr; address = address->ai_next) {
    const int fd = ::socket(address->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    const bool bound = ::bind(fd, address->ai_addr, address->ai_addrlen) == 0;
    ::close(fd);
    if (bound) return true;
  }
  return false;
}

AgentStore::AgentStore(const ElasticSettings& settings, std::chrono::milliseconds operation_timeout,
                       std::function<void(const std::string&)> say, const std::function<bool()>& stop)
    : settings_(settings), operation_timeout_(operation_timeout), say_(std::move(say)) {
  const int fd = is_local_address(settings.host) ? bind_endpoint(settings.host, settings.port) : -1;
  if (fd >= 0) {
    c10d::TCPStoreOptions options;
    options.port = static_cast<uint16_t>(settings.port);
    options.isServer = true;
    options.waitWorkers = false;
    options.timeout = operation_timeout;
    // Before LibTorch 2.8 TCPStore binds the port itself (on every interface): the socket here only showed that
    // the port is free on this host, and goes before the store takes it.
    if (!compat::serve_from_listening_socket(options, fd)) ::close(fd);
    try {
      auto store = c10::make_intrusive<c10d::TCPStore>(settings.host, options);
      store->add(kConnectedKey, 1);
      client_ = store;
      hosting_ = true;
      return;
    } catch (const std::exception&) {
      // Another agent of this host took the port in between: join it as a client, below.
    }
  }
  client_ = reconnect(Clock::now() + settings.join_timeout, stop);
}

c10::intrusive_ptr<c10d::Store> AgentStore::reconnect(Clock::time_point deadline, const std::function<bool()>& stop) {
  std::string last_error;
  std::string another_service;
  while (!stop()) {
    if (hosting_) return client_;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    try {
      return connect_once(settings_.host, settings_.port,
                          std::max(std::min(operation_timeout_, left), std::chrono::milliseconds(100)), stop);
    } catch (const AnotherService& error) {
      another_service = first_line(error.what());
      last_error = another_service;
    } catch (const std::exception& error) {
      last_error = another_service.empty() ? first_line(error.what()) : another_service;
    }
    if (!said_waiting_ && say_) {
      say_(fmt::format("waiting for the elastic job's store at {}:{} ({}); trying until join_timeout {:.0f} s",
                       settings_.host, settings_.port, last_error, settings_.join_timeout.count() / 1000.0));
    }
    said_waiting_ = true;
    if (Clock::now() + kConnectPause >= deadline) {
      throw CommError(fmt::format("cannot reach the elastic job's store at {}:{} within join_timeout {:.0f} s ({}); "
                                  "check that the agent on that host runs and that `rdzv_endpoint` names it, the "
                                  "same on every node",
                                  settings_.host, settings_.port, settings_.join_timeout.count() / 1000.0, last_error));
    }
    std::this_thread::sleep_for(kConnectPause);
  }
  return {};
}

}  // namespace tandem::launch
