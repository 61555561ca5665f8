#include "apps/command.h"

#include <algorithm>
#include <utility>

namespace tandem::app {

void CommandRegistry::add(std::string name, std::string description, DefineCommand define) {
  entries_.push_back({std::move(name), std::move(description), std::move(define)});
}

std::function<int()> CommandRegistry::define_all(CLI::App& parent) const {
  parent.require_subcommand(1);
  std::vector<const Entry*> by_name;
  for (const Entry& entry : entries_) by_name.push_back(&entry);
  std::sort(by_name.begin(), by_name.end(), [](const Entry* a, const Entry* b) { return a->name < b->name; });
  std::vector<std::pair<const CLI::App*, std::function<int()>>> commands;
  for (const Entry* entry : by_name) {
    CLI::App* command = parent.add_subcommand(entry->name, entry->description);
    commands.emplace_back(command, entry->define(*command));
  }
  return [commands]() -> int {
    for (const auto& [command, run] : commands) {
      if (command->parsed()) return run();
    }
    return 2;  // unreachable: CLI11 requires one command
  };
}

CommandRegistry& program_commands() {
  static CommandRegistry commands;
  return commands;
}

CommandRegistration::CommandRegistration(std::string name, std::string description, DefineCommand define)
    : CommandRegistration(program_commands(), std::move(name), std::move(description), std::move(define)) {}

CommandRegistration::CommandRegistration(CommandRegistry& registry, std::string name, std::string description,
                                         DefineCommand define) {
  registry.add(std::move(name), std::move(description), std::move(define));
}

}  // namespace tandem::app
