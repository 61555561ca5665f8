#pragma once
// Text made safe for the two places the run report puts it: HTML (names, paths, notes) and a
// <script type="application/json"> element (the charts' data).
#include <nlohmann/json.hpp>
#include <string>

namespace tandem::monitor::report {

// For element text and attribute values, quoted with either quote.
std::string html_escape(const std::string& text);

// Only "</script" or "<!--" could end or change a JSON script element early, and both need a '<', which JSON
// holds only inside strings, where \u003c means the same. Text that is not UTF-8 is replaced, not thrown on.
std::string json_for_script(const nlohmann::json& value);

}  // namespace tandem::monitor::report
