#pragma once
// The one line for a checkpoint that cannot be used itself (damaged, cut short, not one at all), which every
// reader of its files throws, and which the run dir's search reports without its advice. Internal to checkpoint/.
#include <string>

namespace tandem::checkpoint {

// `what` is wrong with the checkpoint at `path` itself: InvalidArgument, one line that says to move it aside.
[[noreturn]] void throw_unusable(const std::string& what, const std::string& path);
// throw_unusable's line without its advice to move the checkpoint aside (the run dir's search moves it).
std::string without_advice(const std::string& line);

}  // namespace tandem::checkpoint
