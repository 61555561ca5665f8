#pragma once
// The run report's own style sheet and script (report.css and report.js beside this header), which CMake embeds
// in the library as bytes (cmake/TandemEmbed.cmake), so that the page carries them inline. Keeping them as real
// files lets editors and linters read them as CSS and JavaScript.
#include <string_view>

namespace tandem::monitor::report {

// The page's style; dygraphs' sheet comes before it, so these rules win over dygraphs' own.
std::string_view page_style();
// Draws every chart of #run-data, then records in the DOM what it drew (see tandem/monitor/report.h).
std::string_view page_script();

}  // namespace tandem::monitor::report
