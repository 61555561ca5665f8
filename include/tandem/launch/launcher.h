#pragma once
// Starts and supervises the workers of one node for `tandem run`. The failure model (docs/launcher.md):
// the first worker to exit non-zero or die by a signal stops all the others (SIGTERM, then SIGKILL after the
// grace period); while plan.max_restarts allows, the whole group then starts again, else that worker's exit
// code becomes the launcher's. SIGINT/SIGTERM/SIGHUP to the launcher are forwarded to every worker and end the
// run without a restart; no worker outlives the launcher.
#include "tandem/launch/launch_options.h"
#include "tandem/launch/worker_exit.h"

namespace tandem::launch {

// Runs plan.command once per local rank and blocks until every worker and every process they started in their
// process groups is gone, in the last attempt. Worker output goes to this process's stdout/stderr with a "[rank] "
// prefix (and to the rank's log file, across attempts). Each restart is one line on stderr. Returns the exit code
// for `tandem run`: 0 when all succeeded, the failed worker's shell_code() once no restart is left, 128 + signal
// when the launcher was signalled, 127 (126) when the command cannot be found (executed). Those outcomes are
// reported on stderr in one line starting "tandem run: ". On one node it first starts the workers' rendezvous store
// (local_store.h). Throws InvalidArgument when the log directory cannot be created or written in, or when on
// several nodes no host has the master's name; CommError when the store's port cannot be bound; no worker has
// started then.
int launch(const LaunchPlan& plan);

}  // namespace tandem::launch
