#include "tandem/launch/launcher.h"

#include <fmt/format.h>
#include <netdb.h>
#include <unistd.h>

#include <map>
#include <optional>
#include <string>

#include "elastic_agent.h"
#include "in_job_recovery.h"
#include "output_relay.h"
#include "supervisor.h"
#include "tandem/launch/local_store.h"
#include "tandem/util/error.h"

namespace tandem::launch {
namespace {

// The workers of one node or of a static multi-node job, restarted on this node alone while plan.max_restarts
// allows. `store`: the rendezvous store the launcher serves to the workers; null where rank 0 serves it. Under
// in-job recovery (one node, so a store of the launcher's) each attempt's lost workers are replaced inside it,
// and each replacement counts as a restart.
int supervise_restarts(const LaunchPlan& plan, const LocalStore* store) {
  Supervisor supervisor(plan.grace_period);
  int restarts = 0;
  for (int attempt = 0;; ++attempt) {
    const auto store_variables = store != nullptr ? store->worker_variables(attempt) : std::map<std::string, std::string>{};
    std::optional<InJobRecovery> recovery;
    if (plan.recovery == Recovery::kInJob) {
      recovery.emplace(store->attempt_store(attempt, plan.nproc_per_node), plan.nproc_per_node,
                       plan.max_restarts - restarts);
    }
    const AttemptEnd end =
        supervisor.run_attempt(plan, attempt, store_variables, -1, recovery ? &*recovery : nullptr);
    if (recovery) restarts += recovery->replacements_started();
    // After a worker failed, and only then, the group starts again while restarts are left; a signal to the
    // launcher, even one that came while it was stopping the failed group, means stop for good.
    const bool restart_due =
        end.kind == AttemptEnd::Kind::kFailed && supervisor.signal_received() == 0 && restarts < plan.max_restarts;
    if (restart_due) {
      ++restarts;
      report(fmt::format("rank {} {}; restarting all {} worker(s) (restart {} of {})", end.failure.rank,
                         end.failure.describe(), end.workers, restarts, plan.max_restarts));
      continue;
    }
    if (end.kind == AttemptEnd::Kind::kSucceeded) return 0;
    std::string used_up = end.kind == AttemptEnd::Kind::kFailed && plan.max_restarts > 0 && restarts == plan.max_restarts
                              ? fmt::format("; all {} restart(s) used up", plan.max_restarts)
                              : "";
    report(describe_end(end) + used_up);
    return exit_code_of(end);
  }
}

// On several nodes every worker connects to the master by name. One that no name server knows would leave each
// worker retrying it until its own timeout (tandem train's: 300 s), with a LibTorch warning every second; a
// lookup that fails for the moment (EAI_AGAIN) may yet succeed, and is left to the workers.
void check_master_resolves(const std::string& host) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int error = ::getaddrinfo(host.c_str(), nullptr, &hints, &found);
  if (found != nullptr) ::freeaddrinfo(found);
  if (error == EAI_NONAME) {
    throw InvalidArgument(fmt::format("`master_addr` {} names no host that this node can find ({}); give node 0's "
                                      "address, or a host name that every node resolves",
                                      host, ::gai_strerror(error)));
  }
}

}  // namespace

int launch(const LaunchPlan& plan) {
  if (plan.elastic) return run_elastic_agent(plan);
  if (plan.nnodes > 1) {
    check_master_resolves(plan.master_addr);
    return supervise_restarts(plan, nullptr);
  }
  // One node: the launcher serves the rendezvous store, on loopback, until every worker is gone.
  LocalStore store(plan.master_addr, plan.master_port);
  LaunchPlan local = plan;
  local.master_port = store.port();
  return supervise_restarts(local, &store);
}

}  // namespace tandem::launch
