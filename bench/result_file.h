#pragma once
// The --json file of `tandem bench allreduce` and `tandem bench train`. It is checked before the benchmark
// starts, so that a path that cannot be written fails in a moment instead of after minutes of measuring.
#include <nlohmann/json.hpp>

#include <string>

namespace tandem::bench {

// Throws InvalidArgument naming --json and `path` when the file could not be created or replaced: its folder is
// missing or not writable, or the path is a folder or a read-only file. Creates nothing.
void check_result_file_writable(const std::string& path);

// Writes `results` indented. Throws Error when the file cannot be written after all (the disk filled, the
// folder went away during the run).
void write_result_file(const std::string& path, const nlohmann::json& results);

}  // namespace tandem::bench
