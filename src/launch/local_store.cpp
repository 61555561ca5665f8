#include "tandem/launch/local_store.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "tandem/util/compat.h"
#include "tandem/util/error.h"

namespace tandem::launch {
namespace {

// A socket bound to address:port and listening, so that connections queue up even before the store serves it.
// Returns it with its port (the kernel's pick when `port` is 0).
std::pair<int, int> listen_on(const std::string& address, int port) {
  sockaddr_in bound{};
  bound.sin_family = AF_INET;
  bound.sin_port = htons(static_cast<uint16_t>(port));
  TANDEM_CHECK(::inet_pton(AF_INET, address.c_str(), &bound.sin_addr) == 1, "not an IPv4 address: ", address);
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw CommError(fmt::format("cannot open a socket for the rendezvous store: {}", std::strerror(errno)));
  socklen_t length = sizeof(bound);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&bound), sizeof(bound)) != 0 || ::listen(fd, SOMAXCONN) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &length) != 0) {
    const int error = errno;
    ::close(fd);
    if (port == 0) {
      throw CommError(fmt::format("cannot bind a free port of {} for the rendezvous store: {}; pass `master_port`",
                                  address, std::strerror(error)));
    }
    throw CommError(fmt::format("`master_port` {} cannot be bound on {} ({}); is another job using it? pick "
                                "another, or leave `master_port` out for a free one",
                                port, address, std::strerror(error)));
  }
  return {fd, ntohs(bound.sin_port)};
}

}  // namespace

LocalStore::LocalStore(const std::string& address, int port) {
  auto [fd, bound_port] = listen_on(address, port);
  port_ = bound_port;
  c10d::TCPStoreOptions options;
  options.port = static_cast<uint16_t>(port_);
  options.isServer = true;
  // The workers' join() counts the ranks; the launcher is no rank and waits for none.
  options.waitWorkers = false;
  if (compat::serve_from_listening_socket(options, fd)) {
    try {
      tcp_store_ = c10::make_intrusive<c10d::TCPStore>(address, options);
    } catch (const std::exception& error) {
      throw CommError(fmt::format("cannot serve the rendezvous store on {}:{}: {}", address, port_, error.what()));
    }
    return;
  }
  // The port stays MASTER_PORT for programs other than tandem's, which open their own store there as they
  // would under torchrun; tandem's workers do not use it.
  ::close(fd);
  std::string directory = (std::filesystem::temp_directory_path() / "tandem-run-XXXXXX").string();
  // mkdtemp creates it with mode 0700.
  if (::mkdtemp(directory.data()) == nullptr) {
    throw CommError(fmt::format("cannot create a directory for the rendezvous store in {}: {}",
                                std::filesystem::temp_directory_path().string(), std::strerror(errno)));
  }
  file_store_directory_ = directory;
}

std::map<std::string, std::string> LocalStore::worker_variables(int restart_count) const {
  if (tcp_store_) return {{"TORCHELASTIC_USE_AGENT_STORE", "True"}};
  // The keys of earlier attempts stay in their files; a new file starts empty.
  return {{"TANDEM_STORE_FILE", fmt::format("{}/store{}", file_store_directory_, restart_count)}};
}

LocalStore::~LocalStore() {
  if (file_store_directory_.empty()) return;
  std::error_code ignored;
  std::filesystem::remove_all(file_store_directory_, ignored);
}

}  // namespace tandem::launch
