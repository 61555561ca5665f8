#pragma once
// checkpoint_damage (tandem/checkpoint/checkpoint_damage.h) of a file already read. Internal to checkpoint/.
#include <string>

#include "tandem/checkpoint/safetensors.h"

namespace tandem::checkpoint {

// What is wrong with `file`, read from `path`, as a checkpoint: not one at all, or the header or the first entry
// whose bytes do not match their checksum; "" when it is whole. Formats before checksums are whole if they
// read. With `parts`, a sharded checkpoint's other files are checked too, one entry at a time: the run dir's
// search does that once, on rank 0; a rank that loads it checks the pieces it reads as it reads them, so that no
// rank reads every rank's file.
std::string file_damage(const TensorFile& file, const std::string& path, bool parts);

}  // namespace tandem::checkpoint
