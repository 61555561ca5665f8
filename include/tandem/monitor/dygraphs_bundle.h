#pragma once
// dygraphs (Debian's libjs-dygraphs, MIT), the charting library the run report inlines so that the page opens
// offline. CMake embeds its minified script and style sheet in the library when it finds them and then sets
// TANDEM_HAVE_DYGRAPHS in tandem/config.h; a build without them defines neither function.
#include <string_view>

namespace tandem::monitor {

std::string_view dygraphs_script();  // dygraph.min.js
std::string_view dygraphs_style();   // dygraph.min.css

}  // namespace tandem::monitor
