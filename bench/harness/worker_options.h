#pragma once
// A driver's workers get their options as one document, not as a command line rebuilt flag by flag: the driver
// writes the worker's options struct as JSON into its result folder and starts this program as
// `tandem bench NAME --worker-options FILE`; the worker reads the file back into the same struct. Each struct's
// fields are named once, by the to_json and from_json beside it (nlohmann's, found by argument-dependent lookup),
// so a field added to a struct reaches the worker, or fails its round-trip test, instead of being dropped.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "bench/harness/child_processes.h"
#include "tandem/util/atomic_file.h"

namespace tandem::bench {

inline constexpr const char* kWorkerOptionsFlag = "--worker-options";

// The hidden flag through which `command` runs as a worker, with the document's path in `file`.
CLI::Option* add_worker_options_flag(CLI::App& command, std::string& file);

// Writes `options` to `file` and returns the shell words that start one worker with it: `program` (this
// executable) `bench BENCHMARK --worker-options FILE`, quoted.
template <typename Options>
std::string worker_command(const std::string& program, const std::string& benchmark, const Options& options,
                           const std::filesystem::path& file) {
  write_file_atomically(file.string(), nlohmann::json(options).dump() + "\n");
  return fmt::format("{} bench {} {} {}", shell_quoted(program), benchmark, kWorkerOptionsFlag,
                     shell_quoted(file.string()));
}

// The document at `file`; InvalidArgument where it is missing or holds no JSON (the flag is internal: only a
// person who typed it meets this).
nlohmann::json read_worker_document(const std::string& file);

// The options a driver wrote with worker_command().
template <typename Options>
Options read_worker_options(const std::string& file) {
  return read_worker_document(file).get<Options>();
}

}  // namespace tandem::bench
