#include "src/io/run_directory.h"

#include <cstdarg>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "kernels/error.h"

namespace rlf {

void RunDirectory::check_writable(const std::string& path, bool overwrite) {
  if (std::filesystem::exists(path + "/summary.json") && !overwrite) {
    throw ConfigError("run directory '" + path +
                      "' already holds a finished run (choose another --run-dir, or pass "
                      "--overwrite)");
  }
  if (std::filesystem::exists(path) && !std::filesystem::is_directory(path)) {
    throw ConfigError("--run-dir '" + path + "' exists and is not a directory");
  }
}

RunDirectory::RunDirectory(const std::string& path, const std::string& resolved_config, bool writer,
                           bool append)
    : path_(path) {
  if (!writer) return;
  std::filesystem::create_directories(path_);
  std::filesystem::remove(file("summary.json"));  // an overwritten run is unfinished until done
  std::ofstream(file("config.ini")) << resolved_config;
  log_ = std::fopen(file("log.txt").c_str(), append ? "a" : "w");
  if (!log_) throw std::runtime_error("cannot write " + file("log.txt"));
}

RunDirectory::~RunDirectory() {
  if (log_) std::fclose(log_);
}

void RunDirectory::log(const char* format, ...) {
  if (!log_) return;
  std::va_list args;
  va_start(args, format);
  std::va_list copy;
  va_copy(copy, args);
  std::vfprintf(stdout, format, args);
  std::vfprintf(log_, format, copy);
  va_end(copy);
  va_end(args);
  std::fflush(stdout);
  std::fflush(log_);
}

void RunDirectory::finish(const std::string& summary_json) {
  if (!log_) return;
  const std::string temporary = file("summary.json.tmp");
  std::ofstream(temporary) << summary_json << "\n";
  std::filesystem::rename(temporary, file("summary.json"));
}

}  // namespace rlf
