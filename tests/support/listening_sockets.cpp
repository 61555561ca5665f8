#include "support/listening_sockets.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <utility>

namespace tandem::testing {
namespace {

constexpr const char* kListenState = "0A";  // TCP_LISTEN in the `st` column

// The kernel prints each 32-bit word of the address in host byte order, so parsing a word back into a
// uint32_t restores the bytes as they lie in the in_addr / in6_addr.
uint32_t word(const std::string& hex, size_t at) {
  return static_cast<uint32_t>(std::stoul(hex.substr(at, 8), nullptr, 16));
}

bool is_loopback_v4(const in_addr& address) { return (ntohl(address.s_addr) >> 24) == 127; }

// One /proc/net/tcp{,6} line's local address, "0100007F:A1B2", into the socket's address and port.
void read_local_address(const std::string& field, bool v6, ListeningSocket& socket) {
  const std::string hex = field.substr(0, field.find(':'));
  socket.port = static_cast<int>(std::stoul(field.substr(field.find(':') + 1), nullptr, 16));
  char text[INET6_ADDRSTRLEN] = {};
  if (!v6) {
    in_addr address{};
    address.s_addr = word(hex, 0);
    ::inet_ntop(AF_INET, &address, text, sizeof(text));
    socket.loopback = is_loopback_v4(address);
  } else {
    in6_addr address{};
    for (size_t i = 0; i < 4; ++i) {
      uint32_t part = word(hex, 8 * i);
      std::memcpy(address.s6_addr + 4 * i, &part, sizeof(part));
    }
    ::inet_ntop(AF_INET6, &address, text, sizeof(text));
    in_addr mapped{};
    std::memcpy(&mapped.s_addr, address.s6_addr + 12, sizeof(mapped.s_addr));
    socket.loopback = IN6_IS_ADDR_LOOPBACK(&address) || (IN6_IS_ADDR_V4MAPPED(&address) && is_loopback_v4(mapped));
  }
  socket.address = text;
}

void read_table(const std::string& path, bool v6, std::vector<ListeningSocket>& sockets) {
  std::ifstream table(path);
  std::string line;
  std::getline(table, line);  // the header
  while (std::getline(table, line)) {
    // sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode ...
    std::istringstream fields(line);
    std::string slot, local, remote, state, queues, timer, retransmits, uid, timeout;
    unsigned long inode = 0;
    if (!(fields >> slot >> local >> remote >> state >> queues >> timer >> retransmits >> uid >> timeout >> inode)) {
      continue;
    }
    if (state != kListenState) continue;
    ListeningSocket socket;
    read_local_address(local, v6, socket);
    socket.inode = inode;
    sockets.push_back(socket);
  }
}

}  // namespace

std::string ListeningSocket::describe() const {
  const bool v6 = address.find(':') != std::string::npos;
  return (v6 ? "[" + address + "]" : address) + ":" + std::to_string(port);
}

std::vector<ListeningSocket> listening_sockets() {
  std::vector<ListeningSocket> sockets;
  read_table("/proc/net/tcp", false, sockets);
  read_table("/proc/net/tcp6", true, sockets);
  return sockets;
}

std::set<unsigned long> open_socket_inodes(int pid) {
  std::set<unsigned long> inodes;
  std::error_code error;
  const std::string prefix = "socket:[";
  for (const auto& entry : std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd", error)) {
    std::string target = std::filesystem::read_symlink(entry.path(), error).string();
    if (!error && target.rfind(prefix, 0) == 0) inodes.insert(std::stoul(target.substr(prefix.size())));
  }
  return inodes;
}

HeldPort::HeldPort(int port) : port_(port) {
  fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(static_cast<uint16_t>(port));
  socklen_t length = sizeof(address);
  if (fd_ < 0 || ::bind(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 || ::listen(fd_, 1) != 0 ||
      ::getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    return;
  }
  port_ = ntohs(address.sin_port);
}

HeldPort::HeldPort() : HeldPort(0) {
  if (!held()) throw std::runtime_error("cannot hold a port of 127.0.0.1 for the test");
}

HeldPort::~HeldPort() {
  if (fd_ >= 0) ::close(fd_);
}

GreetingPort::GreetingPort(std::string greeting, std::chrono::milliseconds delay)
    : greeting_(std::move(greeting)), delay_(delay) {
  thread_ = std::thread([this] {
    std::vector<std::pair<int, std::chrono::steady_clock::time_point>> to_greet;
    while (!stop_) {
      pollfd wait{port_.fd(), POLLIN, 0};
      if (::poll(&wait, 1, 10) == 1) {
        const int fd = ::accept4(port_.fd(), nullptr, nullptr, SOCK_CLOEXEC);
        if (fd >= 0) {
          accepted_.push_back(fd);
          to_greet.push_back({fd, std::chrono::steady_clock::now() + delay_});
        }
      }
      for (auto due = to_greet.begin(); due != to_greet.end();) {
        if (std::chrono::steady_clock::now() < due->second) {
          ++due;
          continue;
        }
        if (::send(due->first, greeting_.data(), greeting_.size(), MSG_NOSIGNAL) < 0) {
          // The client went already; nothing to greet.
        }
        due = to_greet.erase(due);
      }
    }
  });
}

GreetingPort::~GreetingPort() {
  stop_ = true;
  thread_.join();
  for (int fd : accepted_) ::close(fd);
}

}  // namespace tandem::testing
