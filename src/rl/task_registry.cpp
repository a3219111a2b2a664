// The task names make_task knows, and reading a task's INI file into a TaskConfig.
#include <boost/program_options.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>

#include "kernels/error.h"
#include "src/io/input_files.h"
#include "src/rl/addition_task.h"
#include "src/rl/long_addition_task.h"
#include "src/rl/sort_task.h"
#include "src/rl/task.h"

namespace po = boost::program_options;

namespace rlf {

namespace {

struct TaskKind {
  const char* name;
  std::function<std::unique_ptr<Task>(const TaskConfig&)> build;
};

template <typename T>
std::unique_ptr<Task> build(const TaskConfig& config) {
  return std::make_unique<T>(config);
}

const std::vector<TaskKind>& task_kinds() {
  static const std::vector<TaskKind> kinds{{"add", build<AdditionTask>},
                                           {"sort", build<SortTask>},
                                           {"long-add", build<LongAdditionTask>}};
  return kinds;
}

std::string joined_task_names() {
  std::string out;
  for (const std::string& name : task_names()) out += (out.empty() ? "" : ", ") + name;
  return out;
}

}  // namespace

std::vector<std::string> task_names() {
  std::vector<std::string> names;
  for (const TaskKind& kind : task_kinds()) names.emplace_back(kind.name);
  return names;
}

std::unique_ptr<Task> make_task(const TaskConfig& config) {
  for (const TaskKind& kind : task_kinds()) {
    if (config.name == kind.name) return kind.build(config);
  }
  throw ConfigError("unknown task '" + config.name + "' (available: " + joined_task_names() + ")");
}

TaskConfig load_task_config(const std::string& name_or_path, uint64_t seed) {
  const std::string path = resolve_input_file("tasks", name_or_path);
  std::ifstream file(path);
  if (!file) {
    throw ConfigError("task file '" + path +
                      "' cannot be read (give a path or a name in inputs/tasks/)");
  }
  const std::string source = "task file '" + path + "'";

  // Every key is read unregistered: which keys a task accepts is the task's business (its
  // constructor rejects unknown ones), so this only checks that they sit under [task].
  const po::options_description no_registered_keys;
  po::parsed_options parsed(&no_registered_keys);
  try {
    parsed = po::parse_config_file(file, no_registered_keys, /*allow_unregistered=*/true);
  } catch (const po::error& e) {
    throw ConfigError(source + ": " + e.what());
  }
  TaskConfig config;
  config.seed = seed;
  bool has_name = false;
  const std::string section = "task.";
  for (const po::option& option : parsed.options) {
    const std::string& key = option.string_key;
    if (!key.starts_with(section) || key.size() == section.size()) {
      throw ConfigError(source + ": unknown key '" + key +
                        "' (task files hold only a [task] section)");
    }
    const std::string value = option.value.empty() ? std::string() : option.value.front();
    const std::string param = key.substr(section.size());
    if (param == "name") {
      if (has_name) throw ConfigError(source + ": key 'task.name' is given twice");
      config.name = value;
      has_name = true;
    } else if (!config.params.emplace(param, value).second) {
      throw ConfigError(source + ": key '" + key + "' is given twice");
    }
  }
  if (!has_name || config.name.empty()) {
    throw ConfigError(source + ": missing key 'task.name' (one of: " + joined_task_names() + ")");
  }
  return config;
}

}  // namespace rlf
