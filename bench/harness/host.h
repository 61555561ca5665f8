#pragma once
// What the benchmarks say about the machine they run on: its name and CPU in the tables' headers, its memory to
// refuse, before anything starts, a measurement that could not fit in it.
#include <cstdint>
#include <string>

namespace tandem::bench {

std::string host_name();
// /proc/cpuinfo's first "model name", or "unknown".
std::string cpu_model();
// Physical memory, swap not counted: a benchmark that swaps measures the disk.
int64_t host_memory_bytes();

}  // namespace tandem::bench
