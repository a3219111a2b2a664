#include "src/app/options.h"

#include <mpi.h>
#include <sched.h>

#include <boost/program_options.hpp>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <limits>
#include <sstream>

#include "kernels/error.h"
#include "kernels/gpu.h"

namespace rlf {

namespace {
// Rank 0 logs once for the job; 0 outside MPI.
int world_rank() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  int rank = 0;
  if (initialized) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}
}  // namespace

size_t RunOptions::device_memory_bytes() const {
  return parse_bytes(device_memory, "--device-memory");
}

Backend RunOptions::backend_kind() const {
  if (resolved_backend) return *resolved_backend;
  return choose_device(device, parse_backend(backend));
}

po::options_description run_options_description(RunOptions& o) {
  po::options_description d("Run options");
  auto add = d.add_options();
  add("help,h", "print this help and exit");
  add("config", po::value(&o.config_file), "INI file with any of these options (key = value)");
  add("model", po::value(&o.model)->default_value(o.model),
      "model: a name in inputs/models/ (tiny, small, ...) or a path to an INI file");
  add("backend", po::value(&o.backend)->default_value(o.backend),
      "CPU kernels: cpu (fast) | ref (reference loops)");
  add("device", po::value(&o.device)->default_value(o.device),
      "where kernels run: cpu | cuda (the GPU; an error without one) | auto (the GPU if usable, "
      "else the CPU)");
  add("run-dir", po::value(&o.run_dir), "where outputs go (default runs/<command>)");
  add("seed", po::value(&o.seed)->default_value(o.seed), "seed of every random choice");
  add("threads", po::value(&o.threads)->default_value(o.threads),
      "threads of this rank (0: the cores it is bound to)");
  add("device-memory", po::value(&o.device_memory)->default_value(o.device_memory),
      "capacity of the device memory arena, e.g. 4GiB");
  add("json", po::bool_switch(&o.json), "also print results as JSON");
  return d;
}

bool parse_options(const std::string& command, const std::vector<std::string>& args,
                   po::options_description& description, RunOptions& run,
                   po::variables_map* parsed) {
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(args).options(description).run(), vm);
    if (vm.count("help")) {
      std::cout << "usage: rlfusion " << command << " [options]\n\n" << description << "\n";
      return false;
    }
    if (vm.count("config")) {
      const std::string path = vm["config"].as<std::string>();
      std::ifstream file(path);
      if (!file) throw ConfigError("--config: cannot read '" + path + "'");
      try {
        po::store(po::parse_config_file(file, description, /*allow_unregistered=*/false), vm);
      } catch (const po::error& e) {
        throw ConfigError("--config '" + path + "': " + e.what());
      }
    }
    po::notify(vm);
  } catch (const po::error& e) {
    throw ConfigError(std::string(e.what()) + " (see rlfusion " + command + " --help)");
  }
  if (run.threads < 0)
    throw ConfigError("--threads must be >= 0, got " + std::to_string(run.threads));
  run.device_memory_bytes();
  std::string note;
  run.resolved_backend = choose_device(run.device, parse_backend(run.backend), &note);
  if (!note.empty() && world_rank() == 0) std::fprintf(stderr, "rlfusion: %s\n", note.c_str());
  if (run.run_dir.empty()) run.run_dir = "runs/" + command;
  if (parsed) *parsed = vm;
  return true;
}

namespace {
// Shortest text that reads back as the same number (9 / 17 significant digits).
template <typename T>
std::string exact_decimal(T value) {
  std::ostringstream out;
  out << std::setprecision(std::numeric_limits<T>::max_digits10) << value;
  return out.str();
}
}  // namespace

std::string format_options(const po::variables_map& parsed) {
  std::string out = "# resolved options of this run: rerun with --config <this file>\n";
  for (const auto& [key, entry] : parsed) {
    if (key == "config" || key == "help") continue;
    const boost::any& value = entry.value();
    std::string text;
    if (const auto* v = boost::any_cast<std::string>(&value))
      text = *v;
    else if (const auto* v = boost::any_cast<int>(&value))
      text = std::to_string(*v);
    else if (const auto* v = boost::any_cast<uint64_t>(&value))
      text = std::to_string(*v);
    else if (const auto* v = boost::any_cast<float>(&value))
      text = exact_decimal(*v);
    else if (const auto* v = boost::any_cast<double>(&value))
      text = exact_decimal(*v);
    else if (const auto* v = boost::any_cast<bool>(&value))
      text = *v ? "true" : "false";
    else
      continue;
    out += key + " = " + text + "\n";
  }
  return out;
}

size_t parse_bytes(const std::string& text, const std::string& option) {
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  std::string unit = text.substr(used);
  const std::pair<const char*, double> units[] = {{"", 1.0},
                                                  {"B", 1.0},
                                                  {"K", 1024.0},
                                                  {"KiB", 1024.0},
                                                  {"KB", 1e3},
                                                  {"M", 1048576.0},
                                                  {"MiB", 1048576.0},
                                                  {"MB", 1e6},
                                                  {"G", 1073741824.0},
                                                  {"GiB", 1073741824.0},
                                                  {"GB", 1e9},
                                                  {"T", 1099511627776.0},
                                                  {"TiB", 1099511627776.0},
                                                  {"TB", 1e12}};
  if (used > 0 && value > 0 && std::isfinite(value)) {
    for (const auto& [name, scale] : units) {
      if (unit == name) return size_t(value * scale);
    }
  }
  throw ConfigError(option + " must be a positive size such as 512MiB or 4GiB, got '" + text + "'");
}

int resolve_threads(int requested) {
  if (requested > 0) return requested;
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return 1;
}

}  // namespace rlf
