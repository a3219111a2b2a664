// The fast CRC-32C (three interleaved lanes, chunks joined across threads, files read in place)
// against the definition computed bit by bit, on fresh random inputs around every boundary the
// fast paths have.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "src/io/crc32c.h"

namespace rlf {
namespace {

uint32_t crc32c_bitwise(const unsigned char* data, size_t bytes, uint32_t crc = 0) {
  crc = ~crc;
  for (size_t i = 0; i < bytes; ++i) {
    crc ^= data[i];
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ ((crc & 1) ? 0x82F63B78u : 0u);
  }
  return ~crc;
}

std::vector<unsigned char> random_bytes(size_t n, std::mt19937_64& rng) {
  std::vector<unsigned char> bytes(n);
  for (auto& b : bytes) b = static_cast<unsigned char>(rng());
  return bytes;
}

TEST(Crc32c, MatchesTheCheckValueTheDefinitionAndChains) {
  const std::string text = "123456789";
  EXPECT_EQ(crc32c(text.data(), text.size()), 0xE3069283u);  // CRC-32C check value
  EXPECT_EQ(crc32c(text.data() + 4, 5, crc32c(text.data(), 4)), crc32c(text.data(), text.size()));
  // Fresh random bytes at every alignment and tail length, against the bitwise definition.
  std::mt19937_64 rng(std::random_device{}());
  const auto bytes = random_bytes(300, rng);
  for (size_t begin = 0; begin < 9; ++begin) {
    for (size_t count = 0; count + begin <= bytes.size(); count += 7) {
      EXPECT_EQ(crc32c(&bytes[begin], count), crc32c_bitwise(&bytes[begin], count))
          << begin << " " << count;
    }
  }
}

TEST(Crc32cFast, EqualsTheBitwiseDefinitionAroundLaneAndChunkBoundaries) {
  std::mt19937_64 rng(std::random_device{}());
  const size_t lane = 4096, chunk = size_t(1) << 20;
  for (size_t n : {size_t(0), size_t(1), size_t(7), size_t(8), size_t(9), 3 * lane - 1, 3 * lane,
                   3 * lane + 1, 6 * lane + 13, 2 * chunk - 1, 2 * chunk, 3 * chunk + 4097}) {
    const auto data = random_bytes(n, rng);
    const uint32_t start = uint32_t(rng());
    const uint32_t expected = crc32c_bitwise(data.data(), n, start);
    EXPECT_EQ(crc32c(data.data(), n, start), expected) << n;
    EXPECT_EQ(crc32c_parallel(data.data(), n, start), expected) << n;
  }
}

TEST(Crc32cFast, ChainsAtAnySplitAndFromAnyAlignment) {
  std::mt19937_64 rng(std::random_device{}());
  const auto data = random_bytes(40000, rng);
  const uint32_t whole = crc32c_bitwise(data.data() + 3, data.size() - 3);
  for (int trial = 0; trial < 20; ++trial) {
    const size_t split = 3 + rng() % (data.size() - 3);
    const uint32_t first = crc32c(data.data() + 3, split - 3);  // unaligned start
    EXPECT_EQ(crc32c(data.data() + split, data.size() - split, first), whole) << split;
  }
}

TEST(Crc32cFast, AFileIsTheCrcOfItsBytes) {
  std::mt19937_64 rng(std::random_device{}());
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("rlfusion-crc32c-" + std::to_string(getpid()) + ".bin"))
                               .string();
  for (size_t n : {size_t(0), size_t(12345), (size_t(5) << 20) + 77}) {
    const auto data = random_bytes(n, rng);
    std::ofstream(path, std::ios::binary)
        .write(reinterpret_cast<const char*>(data.data()), std::streamsize(n));
    EXPECT_EQ(file_crc32c(path), crc32c_bitwise(data.data(), n)) << n;
  }
  std::filesystem::remove(path);
  EXPECT_THROW(file_crc32c(path), std::runtime_error);
}

}  // namespace
}  // namespace rlf
