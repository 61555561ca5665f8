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
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "tandem/comm/launcher_file_store.h"
#include "tandem/comm/rendezvous.h"
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

// Room the workers' FileStore gets before any starts: the store appends each request to its file, a few KB for
// a rendezvous of many workers. A FileStore that cannot write threw std::system_error from a destructor in every
// worker, which ended each in std::terminate's crash report instead of an error line.
constexpr size_t kStoreRoomBytes = size_t{1} << 20;

// The folder the FileStore's directory goes in: $TMPDIR, else /tmp, as std::filesystem::temp_directory_path()
// picks it (whose own error names neither the variable nor the folder).
std::filesystem::path temp_folder() {
  std::error_code error;
  std::filesystem::path folder = std::filesystem::temp_directory_path(error);
  if (!error) return folder;
  const char* tmpdir = std::getenv("TMPDIR");
  throw InvalidArgument(fmt::format("TMPDIR={} is not a folder ({}): tandem run keeps its rendezvous store in "
                                    "TMPDIR; create that folder, or point TMPDIR at one (unset, it is /tmp)",
                                    tmpdir ? tmpdir : "", error.message()));
}

// Writes kStoreRoomBytes into `directory` and takes them back; throws when they do not fit.
void require_store_room(const std::string& directory) {
  const std::string probe = directory + "/room";
  bool fits = false;
  {
    std::ofstream out(probe, std::ios::binary);
    const std::string block(kStoreRoomBytes, '\0');
    fits = static_cast<bool>(out.write(block.data(), static_cast<std::streamsize>(block.size())).flush());
  }
  const int error = errno;
  std::error_code ignored;
  std::filesystem::remove(probe, ignored);
  if (fits) return;
  std::filesystem::remove_all(directory, ignored);
  throw CommError(fmt::format("{} has no room for tandem run's rendezvous store ({} MiB; {}): free space there, or "
                              "point TMPDIR at another folder",
                              std::filesystem::path(directory).parent_path().string(), kStoreRoomBytes >> 20,
                              std::strerror(error)));
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
  const std::filesystem::path folder = temp_folder();
  std::string directory = (folder / "tandem-run-XXXXXX").string();
  // mkdtemp creates it with mode 0700.
  if (::mkdtemp(directory.data()) == nullptr) {
    throw CommError(fmt::format("cannot create a directory for the rendezvous store in {} (TMPDIR): {}; free space "
                                "there or point TMPDIR at another folder",
                                folder.string(), std::strerror(errno)));
  }
  require_store_room(directory);
  file_store_directory_ = directory;
}

std::map<std::string, std::string> LocalStore::worker_variables(int restart_count) const {
  if (tcp_store_) return {{"TORCHELASTIC_USE_AGENT_STORE", "True"}};
  // The keys of earlier attempts stay in their files; a new file starts empty.
  return {{"TANDEM_STORE_FILE", fmt::format("{}/store{}", file_store_directory_, restart_count)}};
}

c10::intrusive_ptr<c10d::Store> LocalStore::attempt_store(int restart_count, int workers) const {
  if (tcp_store_) return comm::attempt_keys(tcp_store_, restart_count);
  return comm::open_launcher_file_store(worker_variables(restart_count).at("TANDEM_STORE_FILE"), workers,
                                        std::chrono::hours(1));
}

LocalStore::~LocalStore() {
  if (file_store_directory_.empty()) return;
  std::error_code ignored;
  std::filesystem::remove_all(file_store_directory_, ignored);
}

}  // namespace tandem::launch
