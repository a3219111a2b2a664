// Scratch files for the planner's parser tests: one directory per test process (ctest runs tests
// in parallel processes), removed when the process ends.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace rlf::test {

inline std::filesystem::path sim_scratch_dir() {
  static const std::filesystem::path dir = [] {
    const auto d =
        std::filesystem::temp_directory_path() / ("rlf_sim_tests_" + std::to_string(::getpid()));
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}

inline std::string write_scratch(const std::string& name, const std::string& text) {
  const auto path = sim_scratch_dir() / name;
  std::ofstream(path) << text;
  return path.string();
}

}  // namespace rlf::test
