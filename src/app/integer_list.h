// Comma-separated integer lists on the command line ("2,4,8", "3,1").
#pragma once

#include <string>
#include <vector>

namespace rlf {

// The integers of `text`, each in [lowest, highest]; empty when `text` is empty, has an empty item
// or an item that is not such an integer (the caller names the option in its error).
std::vector<int> parse_integer_list(const std::string& text, int lowest, int highest);

}  // namespace rlf
