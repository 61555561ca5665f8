#pragma once
// The --world-sizes of the benchmarks that start jobs of their own (train, memory, overhead).
#include <string>
#include <vector>

namespace tandem::bench {

// "1,2,4" -> {1, 2, 4}: whole numbers of processes from 1, each once. Throws InvalidArgument on anything else.
std::vector<int> parse_world_sizes(const std::string& text);

}  // namespace tandem::bench
