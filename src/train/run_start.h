#pragma once
// Where a run keeps its files, chosen by rank 0 and told to every rank before anything is trained: the run dir
// given, the launcher's runs/<run id> shared by every attempt of a job, the newest run under runs/ (resume), or a
// new runs/<timestamp>; and the newest intact checkpoint in it to continue from. Internal to the loop.
#include <memory>
#include <string>

#include "run_dir_lock.h"
#include "tandem/comm/communicator.h"
#include "tandem/train/loop_options.h"

namespace tandem::train {

struct RunStart {
  std::string run_dir;     // created
  std::string checkpoint;  // empty: a new run
  std::shared_ptr<RunDirLock> lock;  // rank 0's, held until the run ends; null on the other ranks
};

// Collective. Throws InvalidArgument on every rank when `resume` finds nothing to continue or another run holds
// the run dir (run_dir_lock.h), and on a rank that
// cannot read the marker rank 0 leaves in the run dir (or the checkpoint it chose): a run dir that is not on
// storage every rank sees (the others then throw Error naming that rank).
RunStart start_run(const LoopOptions& options, comm::Communicator* communicator);

}  // namespace tandem::train
