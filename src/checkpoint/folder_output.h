#pragma once
// A folder of files written as one (a distributed checkpoint, sharded safetensors): its files go into
// `DIR.tmp.<pid>`, each written atomically, and the folder is renamed into place by publish(), so that `DIR` is
// whole or absent. A folder destroyed unpublished (an error midway) is removed. Internal to checkpoint/.
#include <string>

namespace tandem::checkpoint {

class FolderOutput {
 public:
  // Throws InvalidArgument when `dir` exists (a run's data is never overwritten) or its parent is missing, Error
  // when the temp folder cannot be made.
  explicit FolderOutput(std::string dir);
  ~FolderOutput();
  FolderOutput(const FolderOutput&) = delete;
  FolderOutput& operator=(const FolderOutput&) = delete;

  // What the constructor checks first, for a caller with reading to do before it writes: a refusal comes before
  // the work.
  static void require_absent(const std::string& dir);

  const std::string& dir() const { return dir_; }
  // Where to write the file `name` now.
  std::string path(const std::string& name) const { return temp_ + "/" + name; }
  // Renames the folder into place and syncs its parent; throws Error naming it on failure.
  void publish();

 private:
  std::string dir_;
  std::string temp_;
  bool published_ = false;
};

}  // namespace tandem::checkpoint
