// A run's directory: everything a run writes goes here (resolved config, log, outputs). A
// directory that already holds a finished run (summary.json) is refused unless overwrite is
// set, so finished results are never clobbered by accident.
#pragma once

#include <cstdio>
#include <string>

namespace rlf {

class RunDirectory {
 public:
  // Checks only: throws ConfigError when `path` holds a finished run and !overwrite. Call
  // before any work, then open() once the run is known to be valid.
  static void check_writable(const std::string& path, bool overwrite);

  // Creates the directory, writes config.ini (the resolved options) and opens log.txt. In a
  // multi-rank run only one rank is the writer; the others get a silent RunDirectory whose log()
  // and finish() do nothing, so code that logs runs unchanged on every rank. A resumed run
  // (append) keeps the log of the run it continues.
  RunDirectory(const std::string& path, const std::string& resolved_config, bool writer = true,
               bool append = false);
  ~RunDirectory();
  RunDirectory(const RunDirectory&) = delete;
  RunDirectory& operator=(const RunDirectory&) = delete;

  const std::string& path() const { return path_; }
  bool writer() const { return log_ != nullptr; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

  // printf to stdout and to log.txt, flushed (progress lines survive a killed job).
  void log(const char* format, ...) __attribute__((format(printf, 2, 3)));
  // Marks the run finished: writes summary.json atomically (temporary name, then rename).
  void finish(const std::string& summary_json);

 private:
  std::string path_;
  std::FILE* log_ = nullptr;
};

}  // namespace rlf
