#include "tandem/comm/slurm_nodelist.h"

#include <fmt/format.h>

#include "tandem/util/error.h"

namespace tandem::comm {
namespace {

// Splits on commas that are not inside brackets or parentheses.
std::vector<std::string> split_top_level(const std::string& text) {
  std::vector<std::string> parts;
  std::string current;
  int depth = 0;
  for (char c : text) {
    if (c == '[' || c == '(') ++depth;
    if (c == ']' || c == ')') --depth;
    if (c == ',' && depth == 0) {
      if (!current.empty()) parts.push_back(current);
      current.clear();
    } else {
      current += c;
    }
  }
  if (!current.empty()) parts.push_back(current);
  return parts;
}

int parse_count(const std::string& text, const std::string& whole) {
  try {
    size_t used = 0;
    int value = std::stoi(text, &used);
    if (used == text.size() && value >= 0) return value;
  } catch (const std::exception&) {
  }
  throw InvalidArgument(fmt::format("cannot parse '{}' in SLURM value '{}'", text, whole));
}

// Expands one "prefix[ranges]suffix" item; suffix may itself contain brackets ("rack[1-2]-node[1-2]").
void expand_item(const std::string& item, const std::string& whole, std::vector<std::string>& out) {
  size_t open = item.find('[');
  if (open == std::string::npos) {
    out.push_back(item);
    return;
  }
  size_t close = item.find(']', open);
  if (close == std::string::npos) throw InvalidArgument(fmt::format("unbalanced '[' in SLURM node list '{}'", whole));
  std::string prefix = item.substr(0, open);
  std::string rest = item.substr(close + 1);
  for (const std::string& range : split_top_level(item.substr(open + 1, close - open - 1))) {
    size_t dash = range.find('-');
    std::string first = range.substr(0, dash);
    std::string last = dash == std::string::npos ? first : range.substr(dash + 1);
    int from = parse_count(first, whole);
    int to = parse_count(last, whole);
    if (to < from) throw InvalidArgument(fmt::format("descending range '{}' in SLURM node list '{}'", range, whole));
    for (int n = from; n <= to; ++n) {
      expand_item(prefix + fmt::format("{:0{}}", n, first.size()) + rest, whole, out);
    }
  }
}

}  // namespace

std::vector<std::string> expand_slurm_nodelist(const std::string& nodelist) {
  std::vector<std::string> hosts;
  for (const std::string& item : split_top_level(nodelist)) expand_item(item, nodelist, hosts);
  return hosts;
}

std::vector<int> expand_slurm_tasks_per_node(const std::string& tasks_per_node) {
  std::vector<int> counts;
  for (const std::string& item : split_top_level(tasks_per_node)) {
    size_t paren = item.find("(x");
    int tasks = parse_count(item.substr(0, paren), tasks_per_node);
    int repeat = 1;
    if (paren != std::string::npos) {
      if (item.back() != ')') throw InvalidArgument(fmt::format("cannot parse SLURM_TASKS_PER_NODE '{}'", tasks_per_node));
      repeat = parse_count(item.substr(paren + 2, item.size() - paren - 3), tasks_per_node);
    }
    counts.insert(counts.end(), repeat, tasks);
  }
  return counts;
}

}  // namespace tandem::comm
