#pragma once
// Each subcommand of the `tandem` program lives in its own file and registers itself here at start-up, so
// main.cpp never changes when one is added.
#include <CLI/CLI.hpp>

#include <functional>
#include <string>

namespace tandem::app {

// Adds the subcommand's flags to `command` and returns what runs it once the command line has been parsed;
// the returned function gives the process exit code.
using DefineCommand = std::function<std::function<int()>(CLI::App& command)>;

struct CommandRegistration {
  CommandRegistration(std::string name, std::string description, DefineCommand define);
};

}  // namespace tandem::app
