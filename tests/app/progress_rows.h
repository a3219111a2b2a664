// The rows of a `train` log's progress table, for tests that compare two runs step by step.
#pragma once

#include <cctype>
#include <sstream>
#include <string>
#include <vector>

namespace rlf::test {

// Per progress row, its first `columns` fields (step, reward, accuracy, response length, KL and
// clip fraction for 6: not the timing columns).
inline std::vector<std::vector<std::string>> progress_rows(const std::string& output,
                                                           int columns = 6) {
  std::vector<std::vector<std::string>> rows;
  std::istringstream lines(output);
  std::string line;
  bool in_table = false;
  while (std::getline(lines, line)) {
    if (line.rfind("#   step", 0) == 0) in_table = true;
    if (!in_table || line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    std::vector<std::string> row;
    std::string field;
    for (int i = 0; i < columns && fields >> field; ++i) row.push_back(field);
    // Rows start with their step number (the summary's rows with a word).
    if (!row.empty() && std::isdigit(static_cast<unsigned char>(row[0][0]))) rows.push_back(row);
  }
  return rows;
}

}  // namespace rlf::test
