#pragma once
// What `tandem WORD` says when WORD names no command. CLI11 would say "A subcommand is required", which hides
// that the word was read and not understood; this names the word, the command it most likely meant (a typo
// such as `trian` is one or two letters away) and every command.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <string>
#include <vector>

namespace tandem::app {

// Edits (insert, delete, replace, swap two neighbours) that turn `from` into `to`: "trian" is one swap from
// "train".
inline size_t edit_distance(const std::string& from, const std::string& to) {
  std::vector<std::vector<size_t>> d(from.size() + 1, std::vector<size_t>(to.size() + 1));
  for (size_t i = 0; i <= from.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= to.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= from.size(); ++i) {
    for (size_t j = 1; j <= to.size(); ++j) {
      const size_t replace = d[i - 1][j - 1] + (from[i - 1] == to[j - 1] ? 0 : 1);
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, replace});
      if (i > 1 && j > 1 && from[i - 1] == to[j - 2] && from[i - 2] == to[j - 1]) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[from.size()][to.size()];
}

// "unknown command 'trian': did you mean 'train'? The commands are bench, export-images, report, run, train".
// A command is suggested only when it is at most a third of the word's letters away (two for a short word), so
// a word that resembles none gets the list alone: "unknown command 'xyz'; the commands are ...".
inline std::string unknown_command_line(const std::string& word, std::vector<std::string> commands) {
  std::sort(commands.begin(), commands.end());
  const std::string* nearest = nullptr;
  size_t nearest_distance = std::max<size_t>(2, word.size() / 3) + 1;
  for (const std::string& command : commands) {
    const size_t distance = edit_distance(word, command);
    if (distance < nearest_distance) {
      nearest = &command;
      nearest_distance = distance;
    }
  }
  if (nearest == nullptr) {
    return fmt::format("unknown command '{}'; the commands are {}", word, fmt::join(commands, ", "));
  }
  return fmt::format("unknown command '{}': did you mean '{}'? The commands are {}", word, *nearest,
                     fmt::join(commands, ", "));
}

}  // namespace tandem::app
