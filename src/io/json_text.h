// JSON text for the `--json` twins and the timeline: a string literal with the characters JSON
// requires escaped (run metadata holds user-controlled paths and names).
#pragma once

#include <string>

namespace rlf {

// `text` as a JSON string literal, quotes included.
std::string json_string(const std::string& text);

}  // namespace rlf
