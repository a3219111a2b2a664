#include "src/app/integer_list.h"

#include <cstdlib>
#include <sstream>

namespace rlf {

std::vector<int> parse_integer_list(const std::string& text, int lowest, int highest) {
  if (text.empty() || text.back() == ',') return {};
  std::vector<int> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    char* end = nullptr;
    const long value = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || value < lowest || value > highest) return {};
    out.push_back(int(value));
  }
  return out;
}

}  // namespace rlf
