#pragma once
// Where a run keeps its files: its checkpoints (checkpoint/checkpoint_folder.h), metrics.jsonl and, for image
// folders, class_indices.json. Runs without a --run-dir go to runs/<timestamp>; `resume` without one continues
// the newest run under runs/ that holds a checkpoint.
#include <string>

#include "tandem/train/loop_options.h"

namespace tandem::train {

// Checks, on the rank that writes them (rank 0), that every file and folder a run with `options` writes into can
// be written: the run dir (or runs/ without one), the report, the timeline. A path that fails at the end would
// throw the whole training away, so a program calls this before it loads its data. Throws InvalidArgument
// naming the field and the path.
void check_run_outputs(const LoopOptions& options);

// runs_dir/YYYYmmdd-HHMMSS of the current local time, with a -N suffix if that name is taken. Not created.
std::string timestamped_run_dir(const std::string& runs_dir = "runs");

// RUNS_DIR/NAME of the newest run under runs_dir that holds a checkpoint, or "" if none does. Run names are
// timestamped_run_dir's, YYYYmmdd-HHMMSS with a -N suffix when that second is taken; the numbers in them are
// compared as numbers, so -10 is newer than -9.
std::string newest_run_dir(const std::string& runs_dir);

}  // namespace tandem::train

// The checkpoints of a run dir moved to tandem/checkpoint/checkpoint_folder.h (namespace tandem::checkpoint). This
// include and these names in tandem::train keep programs written against the earlier layout compiling for one
// release; they go in the next.
#include "tandem/checkpoint/checkpoint_folder.h"

namespace tandem::train {
using checkpoint::checkpoint_path;
using checkpoint::find_latest_checkpoint;
using checkpoint::find_latest_intact_checkpoint;
using checkpoint::folder_entries;
using checkpoint::list_checkpoints;
using checkpoint::prune_checkpoints;
using checkpoint::remove_unfinished_checkpoints;
}  // namespace tandem::train
