// `tandem bench`: benchmarks that print tables (and JSON with --json). Each benchmark is its own command, in its
// own folder of bench/ (docs/benchmarks.md), registered in bench_commands().
#include "bench/bench_commands.h"

namespace tandem::app {

CommandRegistry& bench_commands() {
  static CommandRegistry commands;
  return commands;
}

namespace {

const CommandRegistration kBench{
    "bench", "Benchmarks: all-reduce bandwidth, training steps against PyTorch DDP, and more (tandem bench --help)",
    [](CLI::App& command) -> std::function<int()> { return bench_commands().define_all(command); }};

}  // namespace
}  // namespace tandem::app
