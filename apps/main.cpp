// The `tandem` program: dispatches to the subcommands registered by the other files of apps/, and is the
// only place where an exception becomes a one-line message and an exit code.
#include <fmt/format.h>

#include <cstdio>
#include <map>
#include <vector>

#include "apps/command.h"
#include "apps/option_names.h"
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
    std::fprintf(stderr, "tandem: error: %s\n", app::with_flag_names(error.what()).c_str());
    return 2;
  }
  try {
    for (auto& [command, run] : runners) {
      if (command->parsed()) return run();
    }
    return 2;
  } catch (const InvalidArgument& error) {
    // The library names the options it refuses (`device`); the user typed flags (--device).
    log::write("error: ", app::with_flag_names(error.what()));
    comm::abort_job_after_error(2);
    return 2;
  } catch (const std::exception& error) {
    log::write("error: ", app::with_flag_names(error.what()));
    comm::abort_job_after_error(1);
    return 1;
  }
}
