#include "src/io/input_files.h"

#include <cstdlib>
#include <filesystem>
#include <vector>

namespace rlf {

std::string resolve_input_file(const std::string& kind, const std::string& name_or_path) {
  if (name_or_path.find('/') != std::string::npos || name_or_path.ends_with(".ini")) {
    return name_or_path;
  }
  const std::string file = kind + "/" + name_or_path + ".ini";
  std::vector<std::string> roots{"inputs"};
  if (const char* env = std::getenv("RLFUSION_INPUTS")) roots.emplace_back(env);
  roots.emplace_back(RLFUSION_DEFAULT_INPUTS);
  for (const std::string& root : roots) {
    if (std::filesystem::exists(root + "/" + file)) return root + "/" + file;
  }
  return "inputs/" + file;
}

}  // namespace rlf
