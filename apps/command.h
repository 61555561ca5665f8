#pragma once
// Each subcommand of the `tandem` program lives in its own file and registers itself here at start-up, so
// main.cpp never changes when one is added. A command with commands of its own (`tandem bench allreduce`) keeps
// them in a registry of the same kind, and its files register with that one.
#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <vector>

namespace tandem::app {

// Adds the subcommand's flags to `command` and returns what runs it once the command line has been parsed;
// the returned function gives the process exit code.
using DefineCommand = std::function<std::function<int()>(CLI::App& command)>;

// The commands of one parent: the program's own, or a command's.
class CommandRegistry {
 public:
  void add(std::string name, std::string description, DefineCommand define);
  // Adds every registered command to `parent`, in the order of their names whatever order the files registered
  // in, and returns what runs the one the command line named; `parent` requires one (CLI11 refuses the line
  // otherwise).
  std::function<int()> define_all(CLI::App& parent) const;

 private:
  struct Entry {
    std::string name;
    std::string description;
    DefineCommand define;
  };
  std::vector<Entry> entries_;
};

// The commands of the `tandem` program.
CommandRegistry& program_commands();

struct CommandRegistration {
  // A command of the `tandem` program.
  CommandRegistration(std::string name, std::string description, DefineCommand define);
  // A command of another command, which owns `registry`.
  CommandRegistration(CommandRegistry& registry, std::string name, std::string description, DefineCommand define);
};

}  // namespace tandem::app
