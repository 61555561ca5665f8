#include "tandem/comm/store_probe.h"

#include <fmt/format.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "tandem/util/compat.h"

namespace tandem::comm {
namespace {

using ProbeClock = std::chrono::steady_clock;
using Verdict = StoreProbe::Verdict;

// How much of another service's bytes a message shows: enough for a banner to say who listens.
constexpr size_t kShownBytes = 24;

int millis_left_until(ProbeClock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - ProbeClock::now()).count();
  return static_cast<int>(std::max<int64_t>(left, 0));
}

// Random, so that neither the key nor the answer can be anything a job put in its store.
std::string probe_random_hex() {
  std::random_device device;
  return fmt::format("{:08x}{:08x}", device(), device());
}

// The start of what a peer sent, as text fit for one line: a banner names the service ("SSH-2.0-OpenSSH_9.2p1").
std::string start_of(const std::vector<uint8_t>& bytes) {
  std::string text;
  for (size_t i = 0; i < std::min(bytes.size(), kShownBytes); ++i) {
    text += std::isprint(bytes[i]) ? static_cast<char>(bytes[i]) : '.';
  }
  return bytes.size() > kShownBytes ? text + "..." : text;
}

// The verdict on a peer whose bytes (none where it closed the connection) are no store's answer.
StoreProbe answer_of_no_store(const std::vector<uint8_t>& received) {
  if (received.empty()) {
    return {Verdict::kNotAStore, "it closed the connection without answering, which no c10d store does: another "
                                 "service listens there"};
  }
  return {Verdict::kNotAStore, fmt::format("it answered as no c10d store does (\"{}\"): another service listens there",
                                           start_of(received))};
}

// Sends the request on `fd`, just connected, and reads until the answer is whole, wrong, or the deadline passed.
StoreProbe ask_for_the_echo(int fd, ProbeClock::time_point deadline, std::chrono::milliseconds timeout) {
  const std::string value = probe_random_hex();
  const std::vector<uint8_t> request = compat::store_echo_request("/tandem/store_probe/" + probe_random_hex(), value);
  std::vector<uint8_t> answer(sizeof(uint64_t));
  const uint64_t value_size = value.size();
  std::memcpy(answer.data(), &value_size, sizeof(value_size));
  answer.insert(answer.end(), value.begin(), value.end());
  const StoreProbe silent{Verdict::kSilent, fmt::format("it accepted the connection but did not answer within {:.1f} s",
                                                        timeout.count() / 1000.0)};

  // A fresh connection's send buffer takes the few bytes of the request at once; only a peer already gone refuses.
  if (::send(fd, request.data(), request.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(request.size())) {
    return answer_of_no_store({});
  }
  std::vector<uint8_t> received;
  while (received.size() < answer.size()) {
    pollfd wait{fd, POLLIN, 0};
    if (::poll(&wait, 1, millis_left_until(deadline)) != 1) return silent;
    uint8_t bytes[256];
    const ssize_t got = ::recv(fd, bytes, sizeof(bytes), 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return answer_of_no_store(received);
    received.insert(received.end(), bytes, bytes + got);
    const size_t compared = std::min(received.size(), answer.size());
    if (!std::equal(received.begin(), received.begin() + compared, answer.begin())) return answer_of_no_store(received);
  }
  return {Verdict::kStore, ""};
}

// A connection to `address` within the deadline: the socket, or -1 with errno set.
int connect_within(const addrinfo& address, ProbeClock::time_point deadline) {
  const int fd = ::socket(address.ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return -1;
  int error = ::connect(fd, address.ai_addr, address.ai_addrlen) == 0 ? 0 : errno;
  if (error == EINPROGRESS) {
    pollfd wait{fd, POLLOUT, 0};
    socklen_t length = sizeof(error);
    error = ::poll(&wait, 1, millis_left_until(deadline)) == 1
                ? (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &length) == 0 ? error : errno)
                : ETIMEDOUT;
  }
  if (error == 0) return fd;
  ::close(fd);
  errno = error;
  return -1;
}

}  // namespace

StoreProbe probe_store(const std::string& host, int port, std::chrono::milliseconds timeout) {
  const auto deadline = ProbeClock::now() + timeout;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const int lookup = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
  const std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> addresses(found, ::freeaddrinfo);
  if (lookup == EAI_NONAME) {
    return {Verdict::kNoSuchHost, fmt::format("{} names no host this machine can find", host)};
  }
  if (lookup != 0) return {Verdict::kNoConnection, ::gai_strerror(lookup)};
  StoreProbe probe{Verdict::kNoConnection, "no address"};
  for (const addrinfo* address = addresses.get(); address != nullptr; address = address->ai_next) {
    const int fd = connect_within(*address, deadline);
    if (fd < 0) {
      probe.why = std::strerror(errno);
      continue;
    }
    probe = ask_for_the_echo(fd, deadline, timeout);
    ::close(fd);
    return probe;
  }
  return probe;
}

}  // namespace tandem::comm
