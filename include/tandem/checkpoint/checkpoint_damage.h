#pragma once
// What load_checkpoint (checkpoint/checkpoint.h) checks before restoring anything, asked on its own: the run dir's
// search for the newest intact checkpoint asks it of each, newest first (checkpoint/checkpoint_folder.h).
#include <string>

namespace tandem::checkpoint {

// That the file at `path` reads whole, is a tandem checkpoint and matches its checksums, and, for a sharded
// checkpoint, that every part does (read one entry at a time, one file open at a time). Returns what is wrong,
// in one line starting with the path (and naming the entry whose checksum fails), or "" when nothing is.
// Checkpoints of the formats before checksums are whole if they read.
std::string checkpoint_damage(const std::string& path);

}  // namespace tandem::checkpoint
