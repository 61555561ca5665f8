// The `tandem` program: dispatches to the subcommands registered by the other files of apps/, and is the
// only place where an exception becomes a one-line message and an exit code.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <vector>

#include "apps/command.h"
#include "apps/error_line.h"
#include "apps/unknown_command.h"
#include "tandem/comm/backend.h"
#include "tandem/config.h"
#include "tandem/util/error.h"
#include "tandem/util/log.h"

namespace tandem::app {
namespace {

struct Entry {
  std::string name;
  std::string description;
  DefineCommand define;
};

std::vector<Entry>& registry() {
  static std::vector<Entry> entries;
  return entries;
}

}  // namespace

CommandRegistration::CommandRegistration(std::string name, std::string description, DefineCommand define) {
  registry().push_back({std::move(name), std::move(description), std::move(define)});
}

namespace {

// The refusal of a command line whose first word is no command (or that has none), which CLI11 would answer
// with "A subcommand is required" alone; empty when the first word is a command or a flag for CLI11.
std::string missing_command_problem(int argc, char** argv) {
  std::vector<std::string> names;
  for (const Entry& entry : registry()) names.push_back(entry.name);
  if (argc < 2) {
    std::sort(names.begin(), names.end());
    return fmt::format("a command is required; the commands are {}", fmt::join(names, ", "));
  }
  const std::string word = argv[1];
  if (word.empty() || word.front() == '-' || std::find(names.begin(), names.end(), word) != names.end()) return {};
  return unknown_command_line(word, names);
}

}  // namespace
}  // namespace tandem::app

int main(int argc, char** argv) {
  using namespace tandem;
  CLI::App cli{"tandem: data-parallel training for C++ on LibTorch"};
  cli.require_subcommand(1);
  cli.set_version_flag("--version", std::string("tandem ") + TANDEM_VERSION);
  // A wrong flag is one line, like every other error (CLI11's default adds a second "Run with --help" line).
  cli.failure_message([](const CLI::App*, const CLI::Error& error) {
    return fmt::format("tandem: error: {} (see --help)\n", error.what());
  });
  if (const std::string problem = app::missing_command_problem(argc, argv); !problem.empty()) {
    std::fprintf(stderr, "tandem: error: %s (see --help)\n", problem.c_str());
    return 2;
  }
  std::map<CLI::App*, std::function<int()>> runners;
  try {
    for (auto& entry : app::registry()) {
      CLI::App* command = cli.add_subcommand(entry.name, entry.description);
      runners[command] = entry.define(*command);
    }
    cli.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    // --help and --version exit 0; every wrong command line exits 2, like the InvalidArgument errors below.
    return cli.exit(error) == 0 ? 0 : 2;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "tandem: error: %s\n", app::error_line(error).c_str());
    return 2;
  }
  try {
    for (auto& [command, run] : runners) {
      if (command->parsed()) return run();
    }
    return 2;
  } catch (const InvalidArgument& error) {
    // The library names the options it refuses (`device`); the user typed flags (--device).
    log::write("error: ", app::error_line(error));
    comm::abort_job_after_error(2);
    return 2;
  } catch (const std::exception& error) {
    // LibTorch's own errors (c10::Error) come here too, without their backtrace (error_line.h).
    log::write("error: ", app::error_line(error));
    comm::abort_job_after_error(1);
    return 1;
  }
}
