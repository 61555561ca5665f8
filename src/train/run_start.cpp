#include "run_start.h"

#include <cstdlib>
#include <filesystem>

#include "tandem/comm/rank_agreement.h"
#include "tandem/train/run_directory.h"
#include "tandem/util/error.h"

namespace tandem::train {
namespace {

// Every attempt of a job under tandem run (or torchrun with --rdzv-id) shares TORCHELASTIC_RUN_ID, so its run
// dir runs/<id> is where a restarted attempt finds the first one's checkpoints. Empty outside a launcher, and for
// torchrun's default id "none", which names no job.
std::string launcher_run_dir() {
  const char* run_id = std::getenv("TORCHELASTIC_RUN_ID");
  if (!run_id || !*run_id || std::string(run_id) == "none") return "";
  return std::string("runs/") + run_id;
}

// Rank 0's choice; the files it looks at are rank 0's.
RunStart choose(const LoopOptions& options) {
  RunStart start{options.run_dir, ""};
  if (start.run_dir.empty() && !options.resume && options.continue_launcher_run) start.run_dir = launcher_run_dir();
  if (start.run_dir.empty()) start.run_dir = options.resume ? newest_run_dir("runs") : timestamped_run_dir();
  if (start.run_dir.empty()) throw InvalidArgument("`resume`: no run under runs/ holds a checkpoint; pass `run_dir`");
  // A damaged newest checkpoint (a crash of the storage, a copy cut short) is reported and skipped.
  const auto latest = find_latest_intact_checkpoint(start.run_dir);
  if (options.resume && !latest) throw InvalidArgument("`resume`: no checkpoint in " + start.run_dir);
  if (latest) start.checkpoint = *latest;
  std::error_code error;
  std::filesystem::create_directories(start.run_dir, error);
  if (error) throw Error("cannot create the run directory " + start.run_dir + ": " + error.message());
  remove_unfinished_checkpoints(start.run_dir);
  return start;
}

}  // namespace

RunStart start_run(const LoopOptions& options, comm::Communicator* communicator) {
  RunStart start;
  comm::run_on_all_ranks(communicator, "to prepare the run directory", [&] {
    if (!communicator || communicator->rank() == 0) start = choose(options);
  });
  start.run_dir = comm::rank0_string(communicator, start.run_dir);
  start.checkpoint = comm::rank0_string(communicator, start.checkpoint);
  return start;
}

}  // namespace tandem::train
