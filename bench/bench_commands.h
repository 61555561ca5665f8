#pragma once
// `tandem bench`'s own commands, one per benchmark: each benchmark's folder registers its flags here
// (bench/*/*_flags.cpp), as the program's commands do in apps/command.h, so bench/bench.cpp never changes when
// one is added.
#include "apps/command.h"

namespace tandem::app {

CommandRegistry& bench_commands();

}  // namespace tandem::app
