#include "job_signature.h"

#include <fmt/format.h>
#include <unistd.h>

#include "tandem/comm/local_address.h"

namespace tandem::launch {
namespace {

std::string joined_command(const std::vector<std::string>& command) {
  std::string text;
  for (const std::string& word : command) text += (text.empty() ? "" : " ") + word;
  return text;
}

}  // namespace

std::string describe_node(const std::string& store_host) {
  std::string address;
  try {
    address = comm::local_address_toward(store_host);
  } catch (const std::exception&) {
    char name[256] = {};
    ::gethostname(name, sizeof(name) - 1);
    address = name;
  }
  return fmt::format("{}, pid {}", address, ::getpid());
}

std::map<std::string, std::string> job_signature(const LaunchPlan& plan, const ElasticSettings& settings) {
  const auto seconds = [](std::chrono::milliseconds duration) { return fmt::format("{:g} s", duration.count() / 1000.0); };
  return {{"`nnodes`", fmt::format("{}:{}", settings.min_nodes, settings.max_nodes)},
          {"`max_restarts`", std::to_string(plan.max_restarts)},
          {"`grace_period`", seconds(plan.grace_period)},
          {"`rdzv_conf` timing",
           fmt::format("keep_alive_interval {}, keep_alive_max_attempt {}, last_call_timeout {}",
                       seconds(settings.keep_alive_interval), settings.keep_alive_max_attempt,
                       seconds(settings.last_call))},
          {"`nproc_per_node`", std::to_string(plan.nproc_per_node)},
          {"`recovery`", to_string(plan.recovery)},
          {"command", joined_command(plan.command)}};
}

}  // namespace tandem::launch
