// Scratch files for the planner's parser tests: one directory per test process (ctest runs tests
// in parallel processes), removed when the process ends.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "kernels/error.h"
#include "src/sim/cluster.h"

namespace rlf::test {

// The directory lives as long as the process: a static owner removes it at exit.
struct SimScratchDir {
  std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("rlf_sim_tests_" + std::to_string(::getpid()));
  SimScratchDir() { std::filesystem::create_directories(path); }
  ~SimScratchDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path, ignored);
  }
};

inline const std::filesystem::path& sim_scratch_dir() {
  static const SimScratchDir dir;
  return dir.path;
}

inline std::string write_scratch(const std::string& name, const std::string& text) {
  const auto path = sim_scratch_dir() / name;
  std::ofstream(path) << text;
  return path.string();
}

// The ConfigError message of loading `text` as a cluster file ("" when it loads).
inline std::string cluster_error_of(const std::string& text, const std::string& name) {
  try {
    sim::load_cluster_config(write_scratch(name, text));
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

}  // namespace rlf::test
