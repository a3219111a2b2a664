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

namespace {

constexpr uint64_t kPolynomial = 0xC96C5795D7870F42ull;  // ECMA-182, reflected

// Slicing-by-8 tables: table[0] is the bytewise table, table[k] advances a byte k more places.
using Crc64Tables = std::array<std::array<uint64_t, 256>, 8>;

Crc64Tables make_tables() {
  Crc64Tables table{};
  for (uint64_t i = 0; i < 256; ++i) {
    uint64_t crc = i;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ ((crc & 1) ? kPolynomial : 0);
    table[0][i] = crc;
  }
  for (size_t k = 1; k < 8; ++k) {
    for (size_t i = 0; i < 256; ++i) {
      table[k][i] = (table[k - 1][i] >> 8) ^ table[0][table[k - 1][i] & 0xff];
    }
  }
  return table;
}

}  // namespace

uint64_t crc64(const void* data, size_t bytes, uint64_t crc) {
  static const Crc64Tables table = make_tables();
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  // Eight bytes at a time (little-endian loads), then the tail byte by byte.
  for (; bytes >= 8; bytes -= 8, p += 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    crc ^= word;
    crc = table[7][crc & 0xff] ^ table[6][(crc >> 8) & 0xff] ^ table[5][(crc >> 16) & 0xff] ^
          table[4][(crc >> 24) & 0xff] ^ table[3][(crc >> 32) & 0xff] ^
          table[2][(crc >> 40) & 0xff] ^ table[1][(crc >> 48) & 0xff] ^ table[0][crc >> 56];
  }
  for (; bytes > 0; --bytes, ++p) crc = table[0][(crc ^ *p) & 0xff] ^ (crc >> 8);
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
