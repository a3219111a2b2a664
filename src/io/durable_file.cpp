#include "src/io/durable_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <vector>

namespace rlf {

namespace {

constexpr uint64_t kPolynomial = 0xC96C5795D7870F42ull;  // ECMA-182, reflected

std::array<uint64_t, 256> make_table() {
  std::array<uint64_t, 256> table{};
  for (uint64_t i = 0; i < 256; ++i) {
    uint64_t crc = i;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ ((crc & 1) ? kPolynomial : 0);
    table[i] = crc;
  }
  return table;
}

}  // namespace

uint64_t crc64(const void* data, size_t bytes, uint64_t crc) {
  static const std::array<uint64_t, 256> table = make_table();
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  for (size_t i = 0; i < bytes; ++i) crc = table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return ~crc;
}

uint64_t file_crc64(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read '" + path + "'");
  std::vector<char> buffer(size_t(1) << 20);
  uint64_t crc = 0;
  while (in) {
    in.read(buffer.data(), std::streamsize(buffer.size()));
    crc = crc64(buffer.data(), size_t(in.gcount()), crc);
  }
  return crc;
}

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
