#include "bench/harness/world_sizes.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>

#include "tandem/util/error.h"

namespace tandem::bench {

std::vector<int> parse_world_sizes(const std::string& text) {
  std::vector<int> sizes;
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    if (comma == std::string::npos) comma = text.size();
    const std::string item = text.substr(start, comma - start);
    size_t used = 0;
    long long value = 0;
    try {
      value = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != item.size() || value < 1 || value > std::numeric_limits<int>::max()) {
      throw InvalidArgument(
          fmt::format("'{}' is not a number of processes; give whole numbers from 1, e.g. 1,2,4", item));
    }
    if (std::find(sizes.begin(), sizes.end(), value) != sizes.end()) {
      throw InvalidArgument(fmt::format("world size {} is given twice; give each once", value));
    }
    sizes.push_back(static_cast<int>(value));
    start = comma + 1;
  }
  return sizes;
}

}  // namespace tandem::bench
