#include "tandem/comm/local_address.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "tandem/util/error.h"

namespace tandem::comm {
namespace {

[[noreturn]] void no_route(const std::string& host, const std::string& reason) {
  throw CommError(fmt::format("cannot find the local address that routes to the master {} ({}); set "
                              "GLOO_SOCKET_IFNAME to the network interface the ranks should use",
                              host, reason));
}

}  // namespace

std::string local_address_toward(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (int error = ::getaddrinfo(host.c_str(), "9", &hints, &found); error != 0) no_route(host, ::gai_strerror(error));
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> addresses(found, ::freeaddrinfo);

  std::string last_error = "no address";
  for (const addrinfo* address = found; address != nullptr; address = address->ai_next) {
    const int fd = ::socket(address->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      last_error = std::strerror(errno);
      continue;
    }
    sockaddr_storage local{};
    socklen_t length = sizeof(local);
    // A UDP connect only picks the route and the source address; no packet leaves.
    const bool routed = ::connect(fd, address->ai_addr, address->ai_addrlen) == 0 &&
                        ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) == 0;
    last_error = routed ? "" : std::strerror(errno);
    ::close(fd);
    if (!routed) continue;
    char text[INET6_ADDRSTRLEN] = {};
    const void* raw = local.ss_family == AF_INET6
                          ? static_cast<const void*>(&reinterpret_cast<const sockaddr_in6*>(&local)->sin6_addr)
                          : static_cast<const void*>(&reinterpret_cast<const sockaddr_in*>(&local)->sin_addr);
    if (::inet_ntop(local.ss_family, raw, text, sizeof(text)) != nullptr) return text;
    last_error = std::strerror(errno);
  }
  no_route(host, last_error);
}

}  // namespace tandem::comm
