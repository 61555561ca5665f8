#include "run_start.h"

#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "tandem/checkpoint/checkpoint_folder.h"
#include "tandem/comm/rank_agreement.h"
#include "tandem/train/run_directory.h"
#include "tandem/util/atomic_file.h"
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

std::string node_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "an unnamed host";
  return name;
}

// Rank 0's choice; the files it looks at are rank 0's.
RunStart choose(const LoopOptions& options) {
  RunStart start{options.run_dir, "", nullptr};
  if (start.run_dir.empty() && !options.resume && options.continue_launcher_run) start.run_dir = launcher_run_dir();
  if (start.run_dir.empty()) start.run_dir = options.resume ? newest_run_dir("runs") : timestamped_run_dir();
  if (start.run_dir.empty()) throw InvalidArgument("`resume`: no run under runs/ holds a checkpoint; pass `run_dir`");
  const std::string no_checkpoint = "`resume`: no checkpoint in " + start.run_dir;
  if (options.resume && !std::filesystem::is_directory(start.run_dir)) throw InvalidArgument(no_checkpoint);
  std::error_code error;
  std::filesystem::create_directories(start.run_dir, error);
  if (error) throw Error("cannot create the run directory " + start.run_dir + ": " + error.message());
  // Before anything in the run dir is looked at: another run's checkpoint being written would look unfinished.
  start.lock = std::make_shared<RunDirLock>(start.run_dir, node_name());
  // A damaged newest checkpoint (a crash of the storage, a copy cut short) is reported and skipped.
  const auto latest = checkpoint::find_latest_intact_checkpoint(start.run_dir);
  if (options.resume && !latest) throw InvalidArgument(no_checkpoint);
  if (latest) start.checkpoint = *latest;
  checkpoint::remove_unfinished_checkpoints(start.run_dir);
  return start;
}

// Rank 0 writes it afresh at every start; a rank that reads another nonce (or none) sees another folder.
constexpr const char* kSharedMarker = ".tandem-run-marker";

std::string fresh_nonce() {
  std::random_device entropy;
  const auto now = std::chrono::system_clock::now().time_since_epoch().count();
  return fmt::format("{:08x}{:08x}-{}-{}", entropy(), entropy(), ::getpid(), now);
}

// What this rank cannot read of what rank 0 prepared, or "" when it reads all of it.
std::string unreadable(const RunStart& start, const std::string& nonce) {
  std::ifstream marker(start.run_dir + "/" + kSharedMarker);
  std::string found;
  if (!marker || !std::getline(marker, found)) return "does not find the marker rank 0 wrote there";
  if (found != nonce) return "finds another run's marker there";
  if (!start.checkpoint.empty() && !std::ifstream(start.checkpoint, std::ios::binary)) {
    return "cannot read the checkpoint rank 0 continues from, " + start.checkpoint;
  }
  return "";
}

// Checkpoints are written by rank 0 and read by every rank, so every rank must see rank 0's run dir: a folder
// local to each node (or a relative run dir under other working folders) would leave the ranks of other nodes
// without the checkpoint rank 0 chose, or continuing another one. Rank 0 leaves a fresh nonce in the run dir,
// and every rank reads it back before anything is trained.
void require_shared_run_dir(const RunStart& start, comm::Communicator& communicator) {
  std::string nonce;
  comm::run_on_all_ranks(&communicator, "to mark the run directory", [&] {
    if (communicator.rank() != 0) return;
    nonce = fresh_nonce();
    write_file_atomically(start.run_dir + "/" + kSharedMarker, nonce + "\n");
  });
  nonce = comm::rank0_string(&communicator, nonce);
  comm::run_on_all_ranks(&communicator, "to read the run directory", [&] {
    const std::string problem = unreadable(start, nonce);
    if (problem.empty()) return;
    throw InvalidArgument(fmt::format(
        "rank {} on {} {} in the run dir {} ({}): every rank must see rank 0's run dir; put `run_dir` on storage "
        "every node mounts (a shared file system), as an absolute path",
        communicator.rank(), node_name(), problem, start.run_dir,
        std::filesystem::absolute(start.run_dir).string()));
  });
}

}  // namespace

RunStart start_run(const LoopOptions& options, comm::Communicator* communicator) {
  RunStart start;
  comm::run_on_all_ranks(communicator, "to prepare the run directory", [&] {
    if (!communicator || communicator->rank() == 0) start = choose(options);
  });
  start.run_dir = comm::rank0_string(communicator, start.run_dir);
  start.checkpoint = comm::rank0_string(communicator, start.checkpoint);
  if (communicator && communicator->world_size() > 1) require_shared_run_dir(start, *communicator);
  return start;
}

}  // namespace tandem::train
