#pragma once
// The launcher's side of in-job recovery (docs/recovery.md). One launcher decides each membership epoch and
// publishes it in the attempt's store (comm/membership.h), where the workers wait for it after a failed collective
// and rank 0 looks for it at every step: on one node, `tandem run` itself, which sees its workers exit and its
// replacements get ready; in an elastic job, the agent that serves the job's store, whose loss ends the job anyway.
// Every other node's agent reports its own losses to it through the same store, and the agents report a node whose
// heartbeat stood still (report_node_lost). The Supervisor asks this class what a lost worker means, and which
// replacements to take in.
//
// Private to the launcher.
#include <chrono>
#include <set>
#include <vector>

#include "tandem/comm/rendezvous.h"

namespace tandem::launch {

class InJobRecovery {
 public:
  // Where this launcher stands in the job.
  struct Place {
    int first_slot = 0;   // its node's first slot
    int node_slots = 0;   // its node's workers
    bool decides = true;  // it publishes the memberships; the others report to it
  };
  // `store`: the attempt's keys; `slots`: the job's workers; `replacements_allowed`: what is left of
  // --max-restarts for the whole job (every node's replacements count against it, through the store).
  // `report_within`: how long a report to the deciding launcher may take before this one takes the store for lost.
  InJobRecovery(comm::StorePtr store, int slots, Place place, int replacements_allowed,
                std::chrono::milliseconds report_within = std::chrono::seconds(5));
  // One node, which decides.
  InJobRecovery(comm::StorePtr store, int slots, int replacements_allowed)
      : InJobRecovery(std::move(store), slots, Place{0, slots, true}, replacements_allowed) {}

  struct Loss {
    bool recovered = false;     // the others go on; false: the attempt ends as without in-job recovery
    bool replace = false;       // start a replacement for the slot (a restart is counted)
    int replacements_used = 0;  // the job's, this one included
  };
  // This node's worker of `slot` failed with `exit_code` (-1: killed by a signal) while `members_running` of this
  // node's other members still train. Not recovered: slot 0 (it writes the run's records and checkpoints), exit
  // code 2 (a worker that refused its input, as every rank would), a loss that leaves no member, and, on a node
  // that reports, a report the store did not take within report_within. Otherwise the membership without it is
  // published, or reported to the launcher that publishes it.
  Loss lose(int slot, int exit_code, int members_running);
  // The deciding launcher, between two polls: the other nodes' reports are applied and the replacements that
  // said they are ready are taken in, in one new membership where anything changed. Returns those taken in.
  std::vector<int> take_in_ready();
  // Of those taken in, the ones that formed that membership with the others (they train from then on); empty:
  // none yet. One that never does (the members ended the run first) ends by itself (Membership::close).
  std::vector<int> joined();
  // Whether the Supervisor must poll (take_in_ready, joined): the deciding launcher while replacements are
  // under way or other nodes may report.
  bool needs_polling() const;
  int replacements_allowed() const { return replacements_allowed_; }
  int replacements_started() const { return replacements_started_; }
  int epoch() const { return epoch_; }

  // The node of `node_slots` workers from `first_slot` on was lost (its heartbeat stood still): its slots leave
  // the membership and await its return, which is no restart. Called by the one agent that found it lost.
  static void report_node_lost(const comm::StorePtr& store, int first_slot, int node_slots);

 private:
  bool local(int slot) const;
  bool remote_members() const;
  void apply_reports();
  void publish();

  comm::StorePtr store_;
  int slots_;
  Place place_;
  std::chrono::milliseconds report_within_;
  std::set<int> members_;
  std::set<int> awaiting_;  // slots whose replacement (or node) is to come and is not yet a member
  std::set<int> admitted_;  // members whose replacement has not formed a membership with the others yet
  int replacements_allowed_;
  int replacements_started_ = 0;  // on this node
  int64_t reports_read_ = 0;
  int epoch_ = 0;
};

}  // namespace tandem::launch
