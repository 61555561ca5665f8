#include "support/network_namespaces.h"

#include <unistd.h>

#include "support/processes.h"

namespace tandem::testing {
namespace {

constexpr auto kIpDeadline = std::chrono::seconds(10);

}  // namespace

NetworkNamespaces::NetworkNamespaces(int hosts) {
  if (::geteuid() != 0) {
    unusable_reason_ = "network namespaces need root";
    return;
  }
  if (run_process({"ip", "-V"}, {}, kIpDeadline).exit_code != 0) {
    unusable_reason_ = "iproute2's `ip` cannot be run (apt-get install iproute2)";
    return;
  }
  const std::string prefix = "tdm" + std::to_string(::getpid());
  std::string error;
  switch_ = prefix + "sw";
  if (!ip({"netns", "add", switch_}, error)) {
    unusable_reason_ = "cannot create a network namespace: " + error;
    return;
  }
  created_.push_back(switch_);
  if (!ip({"-n", switch_, "link", "add", "br0", "type", "bridge"}, error) ||
      !ip({"-n", switch_, "link", "set", "br0", "up"}, error)) {
    unusable_reason_ = "cannot make the bridge between the network namespaces: " + error;
    return;
  }
  for (int host = 0; host < hosts; ++host) {
    const std::string name = prefix + static_cast<char>('a' + host);
    if (!ip({"netns", "add", name}, error)) {
      unusable_reason_ = "cannot create a network namespace: " + error;
      return;
    }
    created_.push_back(name);
    namespaces_.push_back(name);
    // Interface names hold at most 15 characters; "tdm" + a pid + one letter does. Both ends are made inside
    // the namespaces, so nothing appears in the machine's own.
    interfaces_.push_back(name);
    const std::string port = "port" + std::to_string(host);
    const bool made = ip({"-n", name, "link", "add", name, "type", "veth", "peer", "name", port, "netns", switch_},
                         error) &&
                      ip({"-n", switch_, "link", "set", port, "master", "br0", "up"}, error) &&
                      ip({"-n", name, "addr", "add", address(host) + "/24", "dev", name}, error) &&
                      ip({"-n", name, "link", "set", "lo", "up"}, error) &&
                      ip({"-n", name, "link", "set", name, "up"}, error);
    if (!made) {
      unusable_reason_ = "cannot connect the network namespaces: " + error;
      return;
    }
  }
}

NetworkNamespaces::~NetworkNamespaces() {
  for (const std::string& name : created_) {
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

bool NetworkNamespaces::bring_link_up(int host, std::string& error) const {
  return ip({"-n", namespaces_.at(static_cast<size_t>(host)), "link", "set", interface(host), "up"}, error);
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
