#include "support/network_namespaces.h"

#include <unistd.h>

#include "support/processes.h"

namespace tandem::testing {
namespace {

constexpr auto kIpDeadline = std::chrono::seconds(10);

}  // namespace

NetworkNamespaces::NetworkNamespaces() {
  if (::geteuid() != 0) {
    unusable_reason_ = "network namespaces need root";
    return;
  }
  if (run_process({"ip", "-V"}, {}, kIpDeadline).exit_code != 0) {
    unusable_reason_ = "iproute2's `ip` cannot be run (apt-get install iproute2)";
    return;
  }
  const std::string prefix = "tdm" + std::to_string(::getpid());
  for (const char host : {'a', 'b'}) {
    const std::string name = prefix + host;
    std::string error;
    if (!ip({"netns", "add", name}, error)) {
      unusable_reason_ = "cannot create a network namespace: " + error;
      return;
    }
    namespaces_.push_back(name);
    // Interface names hold at most 15 characters; "tdm" + a pid + one letter does.
    interfaces_.push_back(name);
  }
  std::string error;
  bool made = ip({"link", "add", interfaces_[0], "type", "veth", "peer", "name", interfaces_[1]}, error);
  for (int host = 0; made && host < 2; ++host) {
    const std::string& name = namespaces_[static_cast<size_t>(host)];
    made = ip({"link", "set", interface(host), "netns", name}, error) &&
           ip({"-n", name, "addr", "add", address(host) + "/24", "dev", interface(host)}, error) &&
           ip({"-n", name, "link", "set", "lo", "up"}, error) &&
           ip({"-n", name, "link", "set", interface(host), "up"}, error);
  }
  // A veth end still outside the namespaces (made failed half-way) is deleted with its peer.
  if (!made) {
    std::string ignored;
    ip({"link", "del", interfaces_[0]}, ignored);
    unusable_reason_ = "cannot connect the network namespaces: " + error;
  }
}

NetworkNamespaces::~NetworkNamespaces() {
  for (const std::string& name : namespaces_) {
    std::string ignored;
    ip({"netns", "del", name}, ignored);
  }
}

std::string NetworkNamespaces::address(int host) const { return "10.77.0." + std::to_string(host + 1); }

std::vector<std::string> NetworkNamespaces::on_host(int host, const std::vector<std::string>& argv) const {
  std::vector<std::string> full{"ip", "netns", "exec", namespaces_.at(static_cast<size_t>(host))};
  full.insert(full.end(), argv.begin(), argv.end());
  return full;
}

bool NetworkNamespaces::take_link_down(int host, std::string& error) const {
  return ip({"-n", namespaces_.at(static_cast<size_t>(host)), "link", "set", interface(host), "down"}, error);
}

bool NetworkNamespaces::ip(const std::vector<std::string>& args, std::string& error) const {
  std::vector<std::string> argv{"ip"};
  argv.insert(argv.end(), args.begin(), args.end());
  ProcessResult result = run_process(argv, {}, kIpDeadline);
  if (!result.timed_out && result.exit_code == 0) return true;
  error = "`ip";
  for (const std::string& arg : args) error += " " + arg;
  error += "` failed: " + (result.timed_out ? std::string("timed out") : result.output);
  while (!error.empty() && error.back() == '\n') error.pop_back();
  return false;
}

}  // namespace tandem::testing
