#include "unusable_checkpoint.h"

#include <fmt/format.h>

#include <filesystem>

#include "tandem/util/error.h"

namespace tandem::checkpoint {

// The run dir's checkpoint before this one may well be whole, and the loop continues from that one once this one
// is out of the way.
[[noreturn]] void throw_unusable(const std::string& what, const std::string& path) {
  throw InvalidArgument(fmt::format("{}; move {} out of the run dir to continue from the checkpoint before it, or "
                                    "start a new run in another `run_dir`",
                                    what, std::filesystem::path(path).filename().string()));
}

std::string without_advice(const std::string& line) { return line.substr(0, line.rfind("; move ")); }

}  // namespace tandem::checkpoint
