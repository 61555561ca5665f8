#pragma once
// Range checks for the `tandem` program's numeric flags, used in place of CLI11's PositiveNumber,
// NonNegativeNumber and Range: those compare as double against the double's limits and print
// "Value -3 not in range 0.000000 to 179769313486231570814527423731704356798070567..." (300 digits). These say
// what the flag accepts and what it got; CLI11 puts the flag's name in front, and main.cpp prints it as the one
// line every error is:
//   tandem: error: --epochs: must be at least 1, not -3 (see --help)
// CLI11 runs a check on the flag's text before converting it to the flag's type. Text that does not convert
// (`--epochs 1.5`, `--lr x`) passes the check and gets CLI11's conversion error instead, so the two never
// disagree about what is a number: both use CLI11's lexical_cast.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <cstdint>
#include <string>

namespace tandem::app {

// Whole-number flags: `minimum` or more (1 for counts, 0 where 0 means "off" or "all").
inline CLI::Validator at_least(int64_t minimum) {
  return CLI::Validator(
      [minimum](std::string& text) -> std::string {
        int64_t value = 0;
        if (!CLI::detail::lexical_cast(text, value) || value >= minimum) return {};
        return fmt::format("must be at least {}, not {}", minimum, text);
      },
      fmt::format("at least {}", minimum));
}

// Real-valued flags: strictly above `bound` (a learning rate or a size in MiB above 0). NaN is refused.
inline CLI::Validator greater_than(double bound) {
  return CLI::Validator(
      [bound](std::string& text) -> std::string {
        double value = 0;
        if (!CLI::detail::lexical_cast(text, value) || value > bound) return {};
        return fmt::format("must be greater than {}, not {}", bound, text);
      },
      fmt::format("above {}", bound));
}

// Real-valued flags: from `low` to `high`, both included. NaN is refused.
inline CLI::Validator between(double low, double high) {
  return CLI::Validator(
      [low, high](std::string& text) -> std::string {
        double value = 0;
        if (!CLI::detail::lexical_cast(text, value) || (value >= low && value <= high)) return {};
        return fmt::format("must be between {} and {}, not {}", low, high, text);
      },
      fmt::format("{} to {}", low, high));
}

}  // namespace tandem::app
