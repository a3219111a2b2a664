#include "src/io/crc32c.h"

#include "src/io/mapped_file.h"

#if defined(__SSE4_2__)
#include <nmmintrin.h>
#endif

#include <tbb/parallel_for.h>

#include <array>
#include <cstring>
#include <stdexcept>
#include <vector>

namespace rlf {

namespace {

// The CRC register is linear over GF(2): for the raw register (no inversions),
//   crc(r, A || B) = shift(crc(r, A), |B|) ^ crc(0, B),   shift(x, n) = crc(x, n zero bytes),
// and shift(., n) is a linear map of 32 bits, tabulated as four 256-entry tables (one per byte of
// x) from its images of the 32 unit vectors. That joins CRCs computed independently.
class Shift {
 public:
  explicit Shift(size_t bytes) {
    std::array<uint32_t, 32> unit{};
    for (int bit = 0; bit < 32; ++bit) unit[size_t(bit)] = raw_zeros(uint32_t(1) << bit, bytes);
    for (size_t k = 0; k < 4; ++k) {
      for (uint32_t b = 0; b < 256; ++b) {
        uint32_t image = 0;
        for (int bit = 0; bit < 8; ++bit)
          if ((b >> bit) & 1) image ^= unit[k * 8 + size_t(bit)];
        table_[k][b] = image;
      }
    }
  }
  uint32_t operator()(uint32_t x) const {
    return table_[0][x & 0xff] ^ table_[1][(x >> 8) & 0xff] ^ table_[2][(x >> 16) & 0xff] ^
           table_[3][x >> 24];
  }

 private:
  static uint32_t raw_zeros(uint32_t crc, size_t bytes);
  std::array<std::array<uint32_t, 256>, 4> table_{};
};

#if defined(__SSE4_2__)

uint64_t load64(const unsigned char* p) {
  uint64_t word;
  std::memcpy(&word, p, 8);
  return word;
}

// Raw register over `bytes` bytes, eight per instruction, the tail byte by byte.
uint32_t raw_serial(uint32_t crc, const unsigned char* p, size_t bytes) {
  uint64_t wide = crc;
  for (; bytes >= 8; bytes -= 8, p += 8) wide = _mm_crc32_u64(wide, load64(p));
  crc = uint32_t(wide);
  for (; bytes > 0; --bytes, ++p) crc = _mm_crc32_u8(crc, *p);
  return crc;
}

uint32_t Shift::raw_zeros(uint32_t crc, size_t bytes) {
  static const unsigned char kZeros[4096] = {};
  for (; bytes > sizeof kZeros; bytes -= sizeof kZeros)
    crc = raw_serial(crc, kZeros, sizeof kZeros);
  return raw_serial(crc, kZeros, bytes);
}

// Three lanes of kLane bytes in flight: one instruction retires per cycle instead of one per
// three.
constexpr size_t kLane = 4096;

uint32_t raw(uint32_t crc, const unsigned char* p, size_t bytes) {
  static const Shift shift_lane(kLane);
  for (; bytes >= 3 * kLane; bytes -= 3 * kLane, p += 3 * kLane) {
    uint64_t a = crc, b = 0, c = 0;
    for (size_t at = 0; at < kLane; at += 8) {
      a = _mm_crc32_u64(a, load64(p + at));
      b = _mm_crc32_u64(b, load64(p + kLane + at));
      c = _mm_crc32_u64(c, load64(p + 2 * kLane + at));
    }
    crc = shift_lane(shift_lane(uint32_t(a)) ^ uint32_t(b)) ^ uint32_t(c);
  }
  return raw_serial(crc, p, bytes);
}

#else

constexpr uint32_t kPolynomial = 0x82F63B78u;  // 0x1EDC6F41, reflected

uint32_t raw(uint32_t crc, const unsigned char* p, size_t bytes) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int bit = 0; bit < 8; ++bit) c = (c >> 1) ^ ((c & 1) ? kPolynomial : 0);
      t[i] = c;
    }
    return t;
  }();
  for (; bytes > 0; --bytes, ++p) crc = table[(crc ^ *p) & 0xff] ^ (crc >> 8);
  return crc;
}

uint32_t Shift::raw_zeros(uint32_t crc, size_t bytes) {
  static const unsigned char kZeros[4096] = {};
  for (; bytes > sizeof kZeros; bytes -= sizeof kZeros) crc = raw(crc, kZeros, sizeof kZeros);
  return raw(crc, kZeros, bytes);
}

#endif

// Chunks of this size go to threads; the CRCs of whole chunks are joined in order.
constexpr size_t kChunk = size_t(1) << 20;

uint32_t raw_parallel(uint32_t crc, const unsigned char* p, size_t bytes) {
  const size_t chunks = bytes / kChunk;
  if (chunks < 2) return raw(crc, p, bytes);
  static const Shift shift_chunk(kChunk);
  std::vector<uint32_t> part(chunks);
  tbb::parallel_for(size_t(0), chunks, [&](size_t i) { part[i] = raw(0, p + i * kChunk, kChunk); });
  for (uint32_t x : part) crc = shift_chunk(crc) ^ x;
  return raw(crc, p + chunks * kChunk, bytes - chunks * kChunk);
}

}  // namespace

uint32_t crc32c(const void* data, size_t bytes, uint32_t crc) {
  return ~raw(~crc, static_cast<const unsigned char*>(data), bytes);
}

uint32_t crc32c_parallel(const void* data, size_t bytes, uint32_t crc) {
  return ~raw_parallel(~crc, static_cast<const unsigned char*>(data), bytes);
}

uint32_t file_crc32c(const std::string& path) {
  const MappedFile file(path);
  return crc32c_parallel(file.data(), file.size());
}

}  // namespace rlf
