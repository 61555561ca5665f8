#pragma once
// Two "hosts" on one machine for real multi-node runs: network namespaces joined by a veth pair, each end with
// its own address in a private test subnet, and nothing else (no route out, so nothing a test does can reach
// beyond them). Needs root and iproute2's `ip`; where either is missing, or the kernel refuses namespaces, the
// constructor leaves the object unusable with the reason, for GTEST_SKIP.
#include <string>
#include <vector>

namespace tandem::testing {

class NetworkNamespaces {
 public:
  // Names carry this process's id, so runs side by side do not collide.
  NetworkNamespaces();
  // Deletes both namespaces, and with them the veth pair and every socket in them.
  ~NetworkNamespaces();
  NetworkNamespaces(const NetworkNamespaces&) = delete;
  NetworkNamespaces& operator=(const NetworkNamespaces&) = delete;

  bool usable() const { return unusable_reason_.empty(); }
  const std::string& unusable_reason() const { return unusable_reason_; }

  // Host 0 or 1: its address (10.77.0.1, 10.77.0.2) and its end of the veth pair.
  std::string address(int host) const;
  const std::string& interface(int host) const { return interfaces_.at(static_cast<size_t>(host)); }
  // The namespace of host `host`, for `ip netns exec`.
  const std::string& name(int host) const { return namespaces_.at(static_cast<size_t>(host)); }
  // `argv` prefixed so that it runs inside host `host`: ip netns exec NAME ARGV...
  std::vector<std::string> on_host(int host, const std::vector<std::string>& argv) const;
  // Cuts host `host` off, as a pulled cable would: its end of the pair goes down and packets stop, with no
  // reset sent to the peer. Returns false (with `error` set) when `ip` fails.
  bool take_link_down(int host, std::string& error) const;

 private:
  // Runs `ip ARGS`; on failure returns false and sets `error` to the command and its output.
  bool ip(const std::vector<std::string>& args, std::string& error) const;

  std::vector<std::string> namespaces_;  // those created, deleted in the destructor
  std::vector<std::string> interfaces_;
  std::string unusable_reason_;
};

}  // namespace tandem::testing
