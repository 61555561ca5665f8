#pragma once
// Each `tandem bench` benchmark lives in its own apps/bench_*.cpp and registers itself here, as the program's
// commands do in command.h, so apps/bench.cpp never changes when one is added.
#include <string>

#include "apps/command.h"

namespace tandem::app {

// `define` receives the benchmark's own subcommand of `tandem bench`, already named and described.
struct BenchCommandRegistration {
  BenchCommandRegistration(std::string name, std::string description, DefineCommand define);
};

}  // namespace tandem::app
