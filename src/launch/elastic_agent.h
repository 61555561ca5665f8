#pragma once
// The agent of one node of an elastic job (`tandem run --rdzv-backend c10d`, docs/launcher.md, "Elastic jobs"):
// it serves or joins the job's store (agent_store.h), joins rounds (round_rendezvous.h), runs this node's
// workers for each round through the Supervisor with the round's ranks, and watches the other nodes
// (heartbeat_watch.h) until the round ends; then it starts the next round, or leaves when the job is done or
// out of restarts.
//
// Private to the launcher: launch() calls it for a plan with `elastic` set.
#include "tandem/launch/launch_options.h"

namespace tandem::launch {

// Runs the job on this node until it is done (0), out of restarts (the failed worker's shell code, or 1 for a
// lost node), or the agent was signalled (128 + signal). Throws CommError when the store cannot be reached
// within join_timeout, TimeoutError when too few nodes came, InvalidArgument when the job refuses this node.
int run_elastic_agent(const LaunchPlan& plan);

}  // namespace tandem::launch
