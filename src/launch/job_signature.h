#pragma once
// What an elastic job's agents must agree on, and how an agent is named in the others' messages.
#include <map>
#include <string>

#include "tandem/launch/launch_options.h"

namespace tandem::launch {

// This agent in the others' messages: the address it reaches the store at `store_host` from, and its pid.
std::string describe_node(const std::string& store_host);

// What every agent of one job must agree on, by what each is called in a refusal: the same workers, and the same
// numbers behind the rounds' decisions (how many nodes, how many restarts) and behind the timing contract of a
// lost node (docs/launcher.md, "A cut link": heartbeats and grace period).
std::map<std::string, std::string> job_signature(const LaunchPlan& plan, const ElasticSettings& settings);

}  // namespace tandem::launch
