#pragma once
// The wording of every refusal of a setting given without another that it depends on, so that they read alike
// wherever they are checked: "--zero needs --strategy ddp: ...", "`rdzv_backend` c10d needs `run_id`: ...",
// "--short-steps is only read with --end-to-end; add that or drop --short-steps". The library's callers name
// options as fields in backticks (main.cpp writes them as flags, apps/option_names.h), the program's commands as
// flags. The caller decides when to refuse; these only say it.
#include <string>
#include <string_view>

namespace tandem {

// "SETTING needs NEEDED": SETTING cannot work without NEEDED. Callers whose reason does not follow a colon
// append it themselves.
inline std::string needs(std::string_view setting, std::string_view needed) {
  std::string line(setting);
  line += " needs ";
  line += needed;
  return line;
}

// "SETTING needs NEEDED: WHY".
inline std::string needs(std::string_view setting, std::string_view needed, std::string_view why) {
  std::string line = needs(setting, needed);
  line += ": ";
  line += why;
  return line;
}

// "SETTING is only read with NEEDED; REMEDY": SETTING would do nothing without NEEDED, so giving it alone is more
// likely a slip than a choice.
inline std::string only_read_with(std::string_view setting, std::string_view needed, std::string_view remedy) {
  std::string line(setting);
  line += " is only read with ";
  line += needed;
  line += "; ";
  line += remedy;
  return line;
}

// "SETTING is only read with NEEDED; add that or drop SETTING".
inline std::string only_read_with(std::string_view setting, std::string_view needed) {
  return only_read_with(setting, needed, std::string("add that or drop ") + std::string(setting));
}

}  // namespace tandem
