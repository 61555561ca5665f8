#include "tandem/launch/agent_store.h"

#include <fmt/format.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <future>
#include <memory>
#include <stdexcept>
#include <thread>

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

// How long a fresh connection is watched for a greeting: a c10d store never speaks first, while SSH, SMTP, FTP,
// MySQL and other such services greet at once. A store client fed such bytes reads them as its answers (a
// length of gigabytes: std::bad_alloc), so the agent must not hand it such a peer.
constexpr std::chrono::milliseconds kGreetingWindow{100};

// Why the peer on `fd`, just connected, is no c10d store, or empty where nothing shows that.
std::string not_a_store(int fd) {
  pollfd wait{fd, POLLIN, 0};
  if (::poll(&wait, 1, static_cast<int>(kGreetingWindow.count())) != 1) return {};
  char byte = 0;
  const ssize_t got = ::recv(fd, &byte, 1, MSG_PEEK);
  if (got > 0) return "it spoke first, which no c10d store does: another service listens there";
  return "it closed the connection at once";
}

// Whether something accepts connections at host:port within `timeout`, and does not show itself another kind of
// service; throws std::runtime_error saying why not. Tried before TCPStore's own connect, which logs an error
// line for every try that fails.
void probe(const std::string& host, int port, std::chrono::milliseconds timeout) {
  AddressList addresses = resolve_endpoint(host, port, AI_NUMERICSERV);
  if (!addresses) throw std::runtime_error(fmt::format("{} names no host this node can find", host));
  std::string why = "no address";
  for (const addrinfo* address = addresses.get(); address != nullptr; address = address->ai_next) {
    const int fd = ::socket(address->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) continue;
    int error = ::connect(fd, address->ai_addr, address->ai_addrlen) == 0 ? 0 : errno;
    if (error == EINPROGRESS) {
      pollfd wait{fd, POLLOUT, 0};
      socklen_t length = sizeof(error);
      error = ::poll(&wait, 1, static_cast<int>(timeout.count())) == 1
                  ? (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length) == 0 ? error : errno)
                  : ETIMEDOUT;
    }
    if (error == 0) {
      why = not_a_store(fd);
      ::close(fd);
      if (why.empty()) return;
      continue;
    }
    ::close(fd);
    why = std::strerror(error);
  }
  throw std::runtime_error(why);
}

// A client of the store at host:port, connected and answering, within `timeout` in all; throws
// std::runtime_error saying why not. The TCPStore runs on a thread of its own: LibTorch 2.x's client constructor
// pings the store and waits for the answer without a deadline, so a peer that accepts connections but never
// answers (a hung store host, a port some other program listens on) would hold the agent past join_timeout for
// ever. Such a thread is left behind, blocked on its own socket, and ends with the process.
c10::intrusive_ptr<c10d::Store> connect_once(const std::string& host, int port, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  probe(host, port, timeout);
  c10d::TCPStoreOptions options;
  options.port = static_cast<uint16_t>(port);
  options.isServer = false;
  options.waitWorkers = false;
  options.timeout = timeout;
  auto answer = std::make_shared<std::promise<c10::intrusive_ptr<c10d::Store>>>();
  std::future<c10::intrusive_ptr<c10d::Store>> connected = answer->get_future();
  std::thread([host, options, answer] {
    try {
      auto store = c10::make_intrusive<c10d::TCPStore>(host, options);
      store->add(kConnectedKey, 1);
      store->wait({kConnectedKey}, options.timeout);
      answer->set_value(store);
    } catch (...) {
      answer->set_exception(std::current_exception());
    }
  }).detach();
  if (connected.wait_until(deadline) != std::future_status::ready) {
    throw std::runtime_error(fmt::format("it accepted the connection but did not answer within {:.1f} s",
                                         timeout.count() / 1000.0));
  }
  return connected.get();
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
                       std::function<void(const std::string&)> say)
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
  client_ = reconnect(Clock::now() + settings.join_timeout);
}

c10::intrusive_ptr<c10d::Store> AgentStore::reconnect(Clock::time_point deadline, const std::function<bool()>& stop) {
  std::string last_error;
  while (!stop()) {
    if (hosting_) return client_;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    try {
      return connect_once(settings_.host, settings_.port,
                          std::max(std::min(operation_timeout_, left), std::chrono::milliseconds(100)));
    } catch (const std::exception& error) {
      last_error = first_line(error.what());
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
