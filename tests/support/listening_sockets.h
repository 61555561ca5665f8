#pragma once
// Listening sockets in tests. What the kernel says is listening: the TCP sockets in LISTEN state of this
// network namespace, read from /proc/net/tcp and /proc/net/tcp6, and which of them a process holds (its
// /proc/PID/fd), so tests see on which addresses a run's rendezvous store and communicators accept
// connections without connecting to them. And HeldPort, a port of 127.0.0.1 taken as another job would, and
// GreetingPort, one where another kind of service (SSH, SMTP) greets every connection.
#include <atomic>
#include <chrono>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace tandem::testing {

struct ListeningSocket {
  std::string address;  // as inet_ntop writes it: "127.0.0.1", "::", "::ffff:127.0.0.1"
  int port = 0;
  bool loopback = false;  // 127.0.0.0/8, ::1 or an IPv4-mapped 127.x address; never a wildcard
  unsigned long inode = 0;

  // "127.0.0.1:41234" or "[::]:41234".
  std::string describe() const;
};

// Every TCP socket listening in this network namespace, IPv4 and IPv6.
std::vector<ListeningSocket> listening_sockets();

// The inodes of the sockets process `pid` has open (empty when its /proc entry cannot be read).
std::set<unsigned long> open_socket_inodes(int pid);

// A port of 127.0.0.1 bound and listening for the object's lifetime, like another job's server.
class HeldPort {
 public:
  // Any free port; throws when none can be had.
  HeldPort();
  // This port; held() is false when another socket has it already.
  explicit HeldPort(int port);
  ~HeldPort();
  HeldPort(const HeldPort&) = delete;
  HeldPort& operator=(const HeldPort&) = delete;

  bool held() const { return fd_ >= 0; }
  int port() const { return port_; }
  int fd() const { return fd_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

// A port of 127.0.0.1 whose server writes `greeting` to every connection it accepts, `delay` after accepting it
// and without reading anything, as SSH or SMTP do (a loaded or distant one after a while), then holds the
// connection open until the object goes.
class GreetingPort {
 public:
  explicit GreetingPort(std::string greeting, std::chrono::milliseconds delay = std::chrono::milliseconds(0));
  ~GreetingPort();
  GreetingPort(const GreetingPort&) = delete;
  GreetingPort& operator=(const GreetingPort&) = delete;

  int port() const { return port_.port(); }

 private:
  HeldPort port_;
  std::string greeting_;
  std::chrono::milliseconds delay_;
  std::atomic<bool> stop_{false};
  std::vector<int> accepted_;  // owned by the thread until it is joined
  std::thread thread_;
};

}  // namespace tandem::testing
