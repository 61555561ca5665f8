#include "html_escape.h"

namespace tandem::monitor::report {

std::string html_escape(const std::string& text) {
  std::string escaped;
  for (const char c : text) {
    switch (c) {
      case '&': escaped += "&amp;"; break;
      case '<': escaped += "&lt;"; break;
      case '>': escaped += "&gt;"; break;
      case '"': escaped += "&quot;"; break;
      case '\'': escaped += "&#39;"; break;
      default: escaped += c;
    }
  }
  return escaped;
}

std::string json_for_script(const nlohmann::json& value) {
  const std::string text =
      value.dump(-1, ' ', /*ensure_ascii=*/true, nlohmann::json::error_handler_t::replace);
  std::string escaped;
  for (const char c : text) escaped += c == '<' ? std::string("\\u003c") : std::string(1, c);
  return escaped;
}

}  // namespace tandem::monitor::report
