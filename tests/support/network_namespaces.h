#pragma once
// "Hosts" on one machine for real multi-node runs: network namespaces, each joined by a veth pair to a bridge in a
// namespace of its own (the switch), each host with its own address in a private test subnet, and nothing else
// (no route out, so nothing a test does can reach beyond them). Needs root and iproute2's `ip`; where either is
// missing, or the kernel refuses namespaces or bridges, the constructor leaves the object unusable with the
// reason, for GTEST_SKIP.
#include <string>
#include <vector>

namespace tandem::testing {

class NetworkNamespaces {
 public:
  // `hosts` namespaces (2 to 26). Names carry this process's id, so runs side by side do not collide.
  explicit NetworkNamespaces(int hosts = 2);
  // Deletes every namespace, and with them the veth pairs, the bridge and every socket in them.
  ~NetworkNamespaces();
  NetworkNamespaces(const NetworkNamespaces&) = delete;
  NetworkNamespaces& operator=(const NetworkNamespaces&) = delete;

  bool usable() const { return unusable_reason_.empty(); }
  const std::string& unusable_reason() const { return unusable_reason_; }

  int hosts() const { return static_cast<int>(interfaces_.size()); }
  // Host 0, 1, ...: its address (10.77.0.1, 10.77.0.2, ...) and its end of its veth pair.
  std::string address(int host) const;
  const std::string& interface(int host) const { return interfaces_.at(static_cast<size_t>(host)); }
  // The namespace of host `host`, for `ip netns exec`.
  const std::string& name(int host) const { return namespaces_.at(static_cast<size_t>(host)); }
  // `argv` prefixed so that it runs inside host `host`: ip netns exec NAME ARGV...
  std::vector<std::string> on_host(int host, const std::vector<std::string>& argv) const;
  // Cuts host `host` off, as a pulled cable would: its end of the pair goes down and packets stop, with no
  // reset sent to the peer. Returns false (with `error` set) when `ip` fails.
  bool take_link_down(int host, std::string& error) const;
  // Plugs the cable back in: the host's end goes up again (its address stays).
  bool bring_link_up(int host, std::string& error) const;

 private:
  // Runs `ip ARGS`; on failure returns false and sets `error` to the command and its output.
  bool ip(const std::vector<std::string>& args, std::string& error) const;

  std::vector<std::string> namespaces_;  // the hosts', in order
  std::string switch_;                   // the bridge's namespace
  std::vector<std::string> created_;     // every namespace created, deleted in the destructor
  std::vector<std::string> interfaces_;
  std::string unusable_reason_;
};

}  // namespace tandem::testing
