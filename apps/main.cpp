// The `tandem` program: dispatches to the subcommands registered by the other files of apps/, and is the
// only place where an exception becomes a one-line message and an exit code.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstdio>
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

// The refusal of a command line whose command, or a command's own command (`tandem bench allreduce`), is
// missing or unknown, which CLI11 answers with "A subcommand is required" alone; empty where CLI11 says what is
// wrong itself. Words are read up to the first flag: tandem's own are only --help and --version, while a
// command's flags may come before its own command and are left to CLI11.
std::string command_word_problem(const CLI::App& cli, const std::vector<std::string>& words) {
  const CLI::App* app = &cli;
  std::string prefix;  // "bench: " below the top level
  for (size_t at = 0;; ++at) {
    const std::vector<const CLI::App*> commands = app->get_subcommands([](const CLI::App*) { return true; });
    if (commands.empty()) return {};
    std::vector<std::string> names;
    for (const CLI::App* command : commands) names.push_back(command->get_name());
    std::sort(names.begin(), names.end());
    if (at == words.size()) {
      return fmt::format("{}a command is required; the commands are {}", prefix, fmt::join(names, ", "));
    }
    const std::string& word = words[at];
    if (!word.empty() && word.front() == '-') {
      if (app != &cli || word == "--help" || word == "-h" || word == "--version") return {};
      return fmt::format("unknown flag '{}': tandem's own flags are --help and --version, the others follow a "
                         "command; the commands are {}",
                         word, fmt::join(names, ", "));
    }
    const auto named = std::find_if(commands.begin(), commands.end(),
                                    [&](const CLI::App* command) { return command->get_name() == word; });
    if (named == commands.end()) return prefix + unknown_command_line(word, names);
    app = *named;
    prefix += word + ": ";
  }
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
  std::function<int()> run;
  try {
    run = app::program_commands().define_all(cli);
    const std::string problem = app::command_word_problem(cli, std::vector<std::string>(argv + 1, argv + argc));
    if (!problem.empty()) {
      std::fprintf(stderr, "tandem: error: %s (see --help)\n", problem.c_str());
      return 2;
    }
    cli.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    // --help and --version exit 0; every wrong command line exits 2, like the InvalidArgument errors below.
    return cli.exit(error) == 0 ? 0 : 2;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "tandem: error: %s\n", app::error_line(error).c_str());
    return 2;
  }
  // The library names the options it refuses (`device`); the user typed flags (--device): error_line maps them.
  const auto fail = [](const std::exception& error, int exit_code) {
    log::write("error: ", app::error_line(error));
    comm::abort_job_after_error(exit_code);
    return exit_code;
  };
  try {
    return run();
  } catch (const InvalidArgument& error) {
    return fail(error, 2);
  } catch (const UnsupportedError& error) {
    // A choice this build, device or backend cannot honour (`precision` 16-mixed on 1.13's CPU, a backend not
    // built in) is as wrong an option as a refused one: the same exit code, so scripts tell both from a failure.
    return fail(error, 2);
  } catch (const std::exception& error) {
    // LibTorch's own errors (c10::Error) come here too, without their backtrace (error_line.h).
    return fail(error, 1);
  }
}
