#pragma once
// The checkpoints of a folder (a run dir): RUN_DIR/checkpoint-EEEE-BBBBBBBB.safetensors (checkpoint/checkpoint.h),
// with a sharded checkpoint's parts beside its file. Listing them in training order, finding the newest intact
// one, and pruning. Which run dir a run continues is train/run_directory.h's.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace tandem::checkpoint {

// RUN_DIR/checkpoint-EEEE-BBBBBBBB.safetensors for (epoch, batches_done); names sort in training order.
std::string checkpoint_path(const std::string& run_dir, int epoch, int64_t batches_done);

// The names of what `folder` (a run dir, or the runs dir above run dirs) holds, files and folders without the
// path, in no order; none where it does not exist. Throws Error when it exists but cannot be read (too many open
// files, no permission), which must not pass for an empty run dir.
std::vector<std::string> folder_entries(const std::string& folder);

// The checkpoints in run_dir, oldest first (epoch, then batch, compared as numbers). Temp files of an
// interrupted write are not checkpoints.
std::vector<std::string> list_checkpoints(const std::string& run_dir);

// The newest of list_checkpoints(run_dir), or nullopt if there is none.
std::optional<std::string> find_latest_checkpoint(const std::string& run_dir);

// The newest checkpoint in run_dir in which checkpoint_damage (checkpoint/checkpoint_damage.h) finds nothing
// wrong, or nullopt if run_dir holds none. Each newer one that is damaged (truncated, a checksum that fails) is
// reported in one log line and renamed to NAME.damaged: kept for a look, but no longer a checkpoint, which pruning
// would otherwise count among the newest and keep in place of the ones the continued run writes. When every
// checkpoint is damaged, throws InvalidArgument naming run_dir and the newest one's damage, and renames none.
// Call only while no other process writes checkpoints into run_dir.
std::optional<std::string> find_latest_intact_checkpoint(const std::string& run_dir);

// Deletes the temp files of checkpoint writes that never finished (their process was killed); call only while
// no other process writes checkpoints into run_dir.
void remove_unfinished_checkpoints(const std::string& run_dir);

// Deletes all but the newest `keep` checkpoints in run_dir; keep <= 0 keeps them all. Throws Error naming a
// file that cannot be removed.
void prune_checkpoints(const std::string& run_dir, int keep);

}  // namespace tandem::checkpoint
