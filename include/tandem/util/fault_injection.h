#pragma once
// Deliberate crashes for the reliability harness (scripts/kill-trials, RELIABILITY.md). With
//   TANDEM_KILL_AT=POINT:RANK:COUNT[,POINT:RANK:COUNT...]
// the process of rank RANK (its RANK variable, 0 without one) kills itself with SIGKILL the moment it reaches
// POINT for the COUNT-th time: no destructor, flush or message runs, exactly as if the machine had killed it.
// Only the launcher's first attempt dies (TORCHELASTIC_RESTART_COUNT unset or 0), so a restarted group runs on,
// and never the replacement that in-job recovery starts for the killed worker (TANDEM_RECOVERY_REPLACEMENT).
// Points:
//   step              before optimizer step COUNT (counted from 1 over the whole run, resumed runs included)
//   safetensors-write halfway through writing the COUNT-th safetensors file of this process (a checkpoint
//                     or --save-weights), with part of its temp file written and before the rename
//   heal-send         in-job recovery: in the middle of sending this process's COUNT-th state to members behind
//                     (docs/recovery.md), after its size and before its bytes
// And a loss that turns bad, for the test of the loop's non-finite check: with
//   TANDEM_INJECT_NAN_AT_STEP=RANK:STEP
// rank RANK's loss is NaN at optimizer step STEP (0-based, counted from the start of the run).
#include <cstdint>
#include <string_view>

namespace tandem::fault {

// Kills this process if TANDEM_KILL_AT names `point`, this rank and `count`. Throws InvalidArgument if
// TANDEM_KILL_AT is malformed.
void kill_point(std::string_view point, int64_t count);

// Whether TANDEM_INJECT_NAN_AT_STEP names this rank and step. Throws InvalidArgument if it is malformed.
bool nan_loss_at(int rank, int64_t step);

}  // namespace tandem::fault
