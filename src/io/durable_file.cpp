#include "src/io/durable_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <vector>

namespace rlf {

void fsync_path(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw std::runtime_error("cannot open '" + path + "' to fsync it");
  const int status = ::fsync(fd);
  ::close(fd);
  if (status != 0) throw std::runtime_error("fsync of '" + path + "' failed");
}

void durable_rename(const std::string& from, const std::string& to) {
  std::filesystem::rename(from, to);
  const std::filesystem::path parent = std::filesystem::path(to).parent_path();
  fsync_path(parent.empty() ? "." : parent.string());
}

void write_text_atomically(const std::string& path, const std::string& text) {
  const std::string temporary = path + ".tmp";
  {
    std::ofstream out(temporary, std::ios::trunc);
    out << text;
    if (!out.flush()) throw std::runtime_error("cannot write '" + temporary + "'");
  }
  fsync_path(temporary);
  durable_rename(temporary, path);
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace rlf
