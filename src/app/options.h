// Command-line and INI options (Boost.Program_options). Every command shares the run options;
// each adds its own. Values from the command line override the --config file; everything is
// validated before any work starts, and a bad value is a ConfigError naming the option.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kernels/ops.h"

// Declarations only: <boost/program_options.hpp> costs 2-3 s of parsing in every file that
// includes this header (52 of them); the files that build or read options include it themselves.
namespace boost::program_options {
class options_description;
class variables_map;
}  // namespace boost::program_options

namespace rlf {

struct RunOptions {
  std::string config_file;
  std::string model = "small";
  std::string backend = "cpu";  // CPU kernel family: cpu | ref
  std::string device = "cpu";   // where kernels run: cpu | cuda | auto
  std::string run_dir;          // default runs/<command>
  uint64_t seed = 1;
  int threads = 0;  // 0: all cores this rank may use
  std::string device_memory = "4GiB";
  bool json = false;

  size_t device_memory_bytes() const;
  // The kernels this run uses: --device resolved (kernels/gpu.h's choose_device) over --backend.
  // parse_options resolves it once, before any work, and logs what `auto` chose.
  Backend backend_kind() const;
  std::optional<Backend> resolved_backend;
};

namespace po = boost::program_options;

// The options every command accepts.
po::options_description run_options_description(RunOptions& options);

// Parses argv (after the command words) and the --config file into `vm`. Unknown options,
// malformed values and unreadable or malformed config files are ConfigErrors. Returns false
// when --help was given (the help text has been printed).
bool parse_options(const std::string& command, const std::vector<std::string>& args,
                   po::options_description& description, RunOptions& run,
                   po::variables_map* parsed = nullptr);

// The resolved options as an INI file (`key = value`, one per line, sorted): written to every
// run directory so the run can be repeated with --config.
std::string format_options(const po::variables_map& parsed);

// "4GiB", "512MiB", "1.5G", "1000000" -> bytes; ConfigError naming `option` otherwise.
size_t parse_bytes(const std::string& text, const std::string& option);

// Threads this rank may use: --threads if set, else the CPUs in its affinity mask.
int resolve_threads(int requested);

}  // namespace rlf
