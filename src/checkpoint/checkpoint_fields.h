#pragma once
// The metadata that holds a checkpoint's CheckpointState (checkpoint/checkpoint.h), declared once: a table of fields,
// each a key, the member it holds and the value older checkpoints without it stand for, which writing and
// reading both walk, so that adding a field is one line. Internal to checkpoint/.
#include <map>
#include <string>

#include "tandem/checkpoint/checkpoint.h"
#include "tandem/checkpoint/safetensors.h"

namespace tandem::checkpoint {

// `key`'s value in `file`; InvalidArgument naming `path` and the key when it is missing.
std::string get_meta(const TensorFile& file, const std::string& key, const std::string& path);
// `key`'s value in `file`, or `fallback` when it is missing.
std::string optional_meta(const TensorFile& file, const std::string& key, const std::string& fallback);

// `state`'s fields as text, into `meta`: the unfinished epoch's progress only inside an epoch, the loss scaler's
// state only where the run has one.
void write_state_fields(const CheckpointState& state, std::map<std::string, std::string>& meta);
// The fields back from `file` (the generators, which are entries, are not read here). Throws InvalidArgument
// naming `path` when a required one is missing or a number is malformed.
CheckpointState read_state_fields(const TensorFile& file, const std::string& path);

}  // namespace tandem::checkpoint
