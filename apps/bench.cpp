// `tandem bench`: benchmarks that print tables (and JSON with --json). Each benchmark is its own subcommand in
// its own apps/bench_*.cpp (bench_command.h); their measurements live in bench/ (docs/benchmarks.md).
#include <string>
#include <utility>
#include <vector>

#include "apps/bench_command.h"

namespace tandem::app {
namespace {

struct BenchEntry {
  std::string name;
  std::string description;
  DefineCommand define;
};

std::vector<BenchEntry>& bench_registry() {
  static std::vector<BenchEntry> entries;
  return entries;
}

}  // namespace

BenchCommandRegistration::BenchCommandRegistration(std::string name, std::string description, DefineCommand define) {
  bench_registry().push_back({std::move(name), std::move(description), std::move(define)});
}

namespace {

const CommandRegistration kBench{
    "bench", "Benchmarks: all-reduce bandwidth, training steps against PyTorch DDP, and more (tandem bench --help)",
    [](CLI::App& command) -> std::function<int()> {
      command.require_subcommand(1);
      std::vector<std::pair<const CLI::App*, std::function<int()>>> benchmarks;
      for (const BenchEntry& entry : bench_registry()) {
        CLI::App* subcommand = command.add_subcommand(entry.name, entry.description);
        benchmarks.emplace_back(subcommand, entry.define(*subcommand));
      }
      return [benchmarks]() -> int {
        for (const auto& [subcommand, run] : benchmarks) {
          if (subcommand->parsed()) return run();
        }
        return 2;  // unreachable: CLI11 requires one subcommand
      };
    }};

}  // namespace
}  // namespace tandem::app
