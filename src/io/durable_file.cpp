#include "src/io/durable_file.h"

#include <fcntl.h>
#include <unistd.h>

#if defined(__SSE4_2__)
#include <nmmintrin.h>
#endif

#include <array>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <vector>

namespace rlf {

namespace {

#if !defined(__SSE4_2__)
constexpr uint32_t kPolynomial = 0x82F63B78u;  // 0x1EDC6F41, reflected

std::array<uint32_t, 256> make_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t crc = i;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ ((crc & 1) ? kPolynomial : 0);
    table[i] = crc;
  }
  return table;
}
#endif

}  // namespace

uint32_t crc32c(const void* data, size_t bytes, uint32_t crc) {
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
#if defined(__SSE4_2__)
  // Eight bytes per instruction (little-endian loads), then the tail byte by byte.
  uint64_t wide = crc;
  for (; bytes >= 8; bytes -= 8, p += 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    wide = _mm_crc32_u64(wide, word);
  }
  crc = uint32_t(wide);
  for (; bytes > 0; --bytes, ++p) crc = _mm_crc32_u8(crc, *p);
#else
  static const std::array<uint32_t, 256> table = make_table();
  for (; bytes > 0; --bytes, ++p) crc = table[(crc ^ *p) & 0xff] ^ (crc >> 8);
#endif
  return ~crc;
}

uint32_t file_crc32c(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read '" + path + "'");
  std::vector<char> buffer(size_t(1) << 20);
  uint32_t crc = 0;
  while (in) {
    in.read(buffer.data(), std::streamsize(buffer.size()));
    crc = crc32c(buffer.data(), size_t(in.gcount()), crc);
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
