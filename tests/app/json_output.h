// Reading the `--json` twin a command prints: its line, and the numbers in it.
#pragma once

#include <cmath>
#include <string>
#include <vector>

namespace rlf::test {

// The one line of `output` that starts with {"bench":"<bench>" (empty when absent).
inline std::string json_line(const std::string& output, const std::string& bench) {
  const auto begin = output.find("{\"bench\":\"" + bench + "\"");
  if (begin == std::string::npos) return "";
  return output.substr(begin, output.find('\n', begin) - begin);
}

// The number after "key": at or after `from` (an object's position), NaN when absent.
inline double json_number(const std::string& json, const std::string& key, size_t from = 0) {
  const auto at = json.find("\"" + key + "\":", from);
  if (at == std::string::npos) return std::nan("");
  return std::stod(json.substr(at + key.size() + 3));
}

// The string after "key": at or after `from` (empty when absent).
inline std::string json_text(const std::string& json, const std::string& key, size_t from = 0) {
  const auto at = json.find("\"" + key + "\":\"", from);
  if (at == std::string::npos) return "";
  const size_t begin = at + key.size() + 4;
  return json.substr(begin, json.find('"', begin) - begin);
}

// The numbers of the array after "key": (empty when absent).
inline std::vector<double> json_numbers(const std::string& json, const std::string& key) {
  std::vector<double> values;
  const auto at = json.find("\"" + key + "\":[");
  if (at == std::string::npos) return values;
  size_t next = at + key.size() + 4;
  while (next < json.size() && json[next] != ']') {
    size_t used = 0;
    values.push_back(std::stod(json.substr(next), &used));
    next += used;
    if (json[next] == ',') ++next;
  }
  return values;
}

// The same array's values as integers (counts of rows or tokens: exact in a double).
inline std::vector<long long> json_integers(const std::string& json, const std::string& key) {
  std::vector<long long> values;
  for (double v : json_numbers(json, key)) values.push_back(std::llround(v));
  return values;
}

}  // namespace rlf::test
