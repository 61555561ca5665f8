#pragma once
// Range checks for the `tandem` program's numeric flags, used in place of CLI11's PositiveNumber,
// NonNegativeNumber and Range: those compare as double against the double's limits and print
// "Value -3 not in range 0.000000 to 179769313486231570814527423731704356798070567..." (300 digits), and know
// nothing of the flag's own type, so `--epochs 99999999999` got CLI11's bare "Could not convert" and `--seed -1`
// wrapped around to 18446744073709551615. These say what the flag accepts and what it got; CLI11 puts the flag's
// name in front, and main.cpp prints it as the one line every error is:
//   tandem: error: --epochs: must be a whole number from 1 to 2147483647, not 99999999999 (see --help)
//
// Each check is made for the flag's type, named at the call: at_least<int>(1) for an `int` flag, between<int64_t>
// for an `int64_t` one. A whole-number check on a real flag would refuse 1.5, and one of a wider type would let
// through text the flag cannot hold, so name the type even where the default matches. The check runs on the
// flag's text before CLI11 converts it and reads it as that conversion does (base-0 strtoll/strtoull for whole
// numbers, strtold for reals), refusing besides what the conversion would wrap, saturate or let through as a
// non-finite real: a flag that passes its check always converts, and no flag reaches CLI11's conversion error.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <string>
#include <type_traits>

namespace tandem::app {
namespace flag_checks_detail {

// Keeps a bound's type from being deduced: the caller names the flag's type, since the literal `1` would make
// every bound an int.
template <typename T>
struct Named {
  using type = T;
};
template <typename T>
using FlagType = typename Named<T>::type;

// What a check compares: reals as the double the flag holds (a float32 bound limits its size, while a rate too
// small for a float32 is still the user's to choose), whole numbers as their own type.
template <typename Number>
using Compared = std::conditional_t<std::is_floating_point_v<Number>, double, Number>;

// `text` as a Number, or false where it is none: not a number, a negative for an unsigned type (strtoull negates
// "-1" into the largest value), beyond the type's range (strtoll saturates), or not finite.
template <typename Number>
bool read_number(const std::string& text, Compared<Number>& value) {
  if constexpr (std::is_floating_point_v<Number>) {
    if (!CLI::detail::lexical_cast(text, value) || !std::isfinite(value)) return false;
    return std::fabs(value) <= static_cast<double>(std::numeric_limits<Number>::max());
  } else {
    if (text.empty()) return false;
    char* end = nullptr;
    errno = 0;
    if constexpr (std::is_signed_v<Number>) {
      const long long whole = std::strtoll(text.c_str(), &end, 0);
      if (errno == ERANGE || whole < std::numeric_limits<Number>::min() || whole > std::numeric_limits<Number>::max()) {
        return false;
      }
      value = static_cast<Number>(whole);
    } else {
      if (text.find('-') != std::string::npos) return false;
      const unsigned long long whole = std::strtoull(text.c_str(), &end, 0);
      if (errno == ERANGE || whole > std::numeric_limits<Number>::max()) return false;
      value = static_cast<Number>(whole);
    }
    return *end == '\0';
  }
}

// A check that accepts the texts that read as a Number for which `accepts` holds, and refuses the others with
// "must be RANGE, not TEXT". --help shows `short_range` after the flag's type ("INT:1 to 2147483647").
template <typename Number, typename Accepts>
CLI::Validator number_check(const std::string& range, const std::string& short_range, Accepts accepts) {
  return CLI::Validator(
      [range, accepts](std::string& text) -> std::string {
        Compared<Number> value{};
        if (read_number<Number>(text, value) && accepts(value)) return {};
        return fmt::format("must be {}, not {}", range, text);
      },
      short_range);
}

}  // namespace flag_checks_detail

// From `low` to `high`, both included: "a whole number from 1 to 1024" for whole-number types, "between 0 and
// 0.99" for reals. Number defaults to double for the real-valued flags' fractions.
template <typename Number = double>
CLI::Validator between(flag_checks_detail::FlagType<Number> low, flag_checks_detail::FlagType<Number> high) {
  const std::string range = std::is_floating_point_v<Number> ? fmt::format("between {} and {}", low, high)
                                                             : fmt::format("a whole number from {} to {}", low, high);
  const auto in_range = [low, high](flag_checks_detail::Compared<Number> value) { return value >= low && value <= high; };
  return flag_checks_detail::number_check<Number>(range, fmt::format("{} to {}", low, high), in_range);
}

// `minimum` or more, up to the largest Number (1 for counts, 0 where 0 means "off" or "all"). A real type's
// largest value is the bound where the value ends up in tensors of that type (at_least<float>).
template <typename Number = int64_t>
CLI::Validator at_least(flag_checks_detail::FlagType<Number> minimum) {
  return between<Number>(minimum, std::numeric_limits<Number>::max());
}

// Reals strictly above `bound`, up to the largest Real: greater_than<float>(0) for a rate the float32 weights
// are multiplied by.
template <typename Real = double>
CLI::Validator greater_than(flag_checks_detail::FlagType<Real> bound) {
  static_assert(std::is_floating_point_v<Real>, "whole numbers: at_least(bound + 1)");
  const Real largest = std::numeric_limits<Real>::max();
  return flag_checks_detail::number_check<Real>(fmt::format("greater than {} and at most {}", bound, largest),
                                                fmt::format("above {}", bound),
                                                [bound](double value) { return value > bound; });
}

// Reals from `low` up to, but not including, `high` (a momentum below 1).
inline CLI::Validator at_least_and_below(double low, double high) {
  return flag_checks_detail::number_check<double>(fmt::format("at least {} and below {}", low, high),
                                                  fmt::format("{} to below {}", low, high),
                                                  [low, high](double value) { return value >= low && value < high; });
}

// Text flags that a library function parses once the work has begun (--normalize MEAN,STD): the same function
// runs on the command line, so a wrong text is refused there, before any work, with the flag's name. What is
// accepted stays the parser's call; `form` says it in the flag's terms, since the parser's own message names the
// library's field.
template <typename Parse>
CLI::Validator parsed_by(Parse parse, const std::string& form) {
  return CLI::Validator(
      [parse, form](std::string& text) -> std::string {
        try {
          parse(text);
          return {};
        } catch (const std::exception&) {
          return fmt::format("must be {}, not {}", form, text);
        }
      },
      "");
}

// A bool flag that takes a value (--reshard-after-forward false): CLI11 reads any whole number as a bool, "2" as
// true, which the help never offers and which is more likely a slip than a choice.
inline CLI::Validator true_or_false() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        if (text == "true" || text == "false") return {};
        return fmt::format("must be true or false, not {}", text);
      },
      "true|false");
}

// Bounds that more than one command's flags share, where the flag's type allows far more than a run can use.
// One 1024 x 1024 RGB image is 12 MiB as float32, and a ResNet's first activations 21 times that; models are
// trained at 224 to 600. --image-size 20000 failed as an allocation of several GB per image.
constexpr int64_t kLargestImageSize = 1024;
// A deadline past a year is none.
constexpr int kLongestTimeoutSeconds = 365 * 24 * 3600;

}  // namespace tandem::app
