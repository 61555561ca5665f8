#pragma once
// The launcher's side of in-job recovery on one node (docs/recovery.md): it decides each membership epoch, since
// it alone sees its workers exit and its replacements get ready, and publishes it in the attempt's store
// (comm/membership.h), where the workers wait for it after a failed collective and rank 0 looks for it at every
// step. The Supervisor asks it what a lost worker means, and which replacements to take in.
//
// Private to the launcher.
#include <set>
#include <vector>

#include "tandem/comm/rendezvous.h"

namespace tandem::launch {

class InJobRecovery {
 public:
  // `store`: the attempt's keys; `slots`: its workers; `replacements_allowed`: what is left of --max-restarts.
  InJobRecovery(comm::StorePtr store, int slots, int replacements_allowed);

  struct Loss {
    bool recovered = false;  // the others go on; false: the attempt ends as without in-job recovery
    bool replace = false;    // start a replacement for the slot (a restart is counted)
  };
  // The worker of `slot` failed with `exit_code` (-1: killed by a signal) while `members_running` other members
  // still train. Not recovered: slot 0 (it writes the run's records and checkpoints), a loss that leaves no
  // member, and exit code 2, a worker that refused its input, as every rank would. Otherwise the membership
  // without it is published.
  Loss lose(int slot, int exit_code, int members_running);
  // The replacements that said they are ready, taken in with a membership that holds them; empty: none yet.
  std::vector<int> take_in_ready();
  // Of those taken in, the ones that formed that membership with the others (they train from then on); empty:
  // none yet. One that never does (the others ended first) still waits, and is stopped with the job's end.
  std::vector<int> joined();
  bool awaiting_replacements() const { return !awaiting_.empty() || !admitted_.empty(); }
  int replacements_started() const { return replacements_started_; }
  int replacements_left() const { return replacements_left_; }
  int epoch() const { return epoch_; }

 private:
  void publish();

  comm::StorePtr store_;
  std::set<int> members_;
  std::set<int> awaiting_;  // slots whose replacement runs but is not yet a member
  std::set<int> admitted_;  // members whose replacement has not formed a membership with the others yet
  int replacements_left_;
  int replacements_started_ = 0;
  int epoch_ = 0;
};

}  // namespace tandem::launch
