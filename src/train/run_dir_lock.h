#pragma once
// One run per run dir (docs/checkpoint.md, "One run per run dir"): the run's rank 0 holds an exclusive flock(2)
// on RUN_DIR/.tandem-run-lock from before it searches the run dir's checkpoints until the run ends, so that a
// second run given the same run dir is refused in one line naming the holder (its pid and host, which the holder
// writes into the file) instead of pruning, renaming and overwriting the first one's checkpoints and records.
// Only rank 0 locks: the other ranks of the run (threads or processes of the same launcher) never take it.
//
// A stale lock cannot block: the kernel releases a flock when its holder's last descriptor closes, so a run that
// died (SIGKILL included) leaves at most a file naming it, which the next run locks at once and rewrites. On NFS
// the client turns flock into a lock the server keeps for every host (released when the holder dies, or when
// its host stops renewing its lease); a file system without locks (Lustre mounted without -o flock) answers
// ENOLCK or EOPNOTSUPP, and the run then goes on unlocked, saying so in one line. Internal to the loop.
#include <string>

namespace tandem::train {

class RunDirLock {
 public:
  // Takes the lock on `run_dir` (which exists) for this process, writing its pid and `host` into the file.
  // Throws InvalidArgument naming the holder when another run holds it, Error when the file cannot be opened.
  RunDirLock(const std::string& run_dir, const std::string& host);
  ~RunDirLock();
  RunDirLock(const RunDirLock&) = delete;
  RunDirLock& operator=(const RunDirLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace tandem::train
