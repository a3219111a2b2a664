// The offload's copy and zeroing with streaming stores (kernels/streaming_copy.h;
// copy_bytes_streaming and zero_memory_streaming in kernels/gpu.h): the bytes std::memcpy /
// std::memset would leave, byte for byte, on random bytes at every alignment of the destination and
// source within a cache line and at sizes around the copy's blocks (64-byte lines, four 4 KiB
// pages), and nothing written outside the range.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/arena.h"
#include "kernels/gpu.h"
#include "kernels/streaming_copy.h"

namespace rlf {
namespace {

constexpr size_t kGuard = 128;  // bytes checked untouched on each side of a destination

std::vector<unsigned char> random_bytes(size_t n, std::mt19937_64& gen) {
  std::vector<unsigned char> bytes(n);
  for (unsigned char& b : bytes) b = static_cast<unsigned char>(gen());
  return bytes;
}

// Sizes on both sides of the blocks' edges, and one of several blocks with a ragged end.
const size_t kSizes[] = {
    0, 1, 15, 16, 63, 64, 65, 127, 4095, 4096, 16383, 16384, 16385, 16447, 3 * 16384 + 4000};

TEST(StreamingCopy, LeavesMemcpysBytesAtEveryAlignmentAndNothingOutside) {
  std::mt19937_64 gen(20261206);
  for (const size_t bytes : kSizes) {
    for (const size_t dst_offset : {size_t(0), size_t(1), size_t(16), size_t(33), size_t(63)}) {
      for (const size_t src_offset : {size_t(0), size_t(7), size_t(40)}) {
        const std::vector<unsigned char> source = random_bytes(src_offset + bytes, gen);
        const std::vector<unsigned char> before =
            random_bytes(dst_offset + bytes + 2 * kGuard, gen);
        std::vector<unsigned char> want = before, got = before, through_gpu_h = before;
        unsigned char* at = want.data() + kGuard + dst_offset;
        std::memcpy(at, source.data() + src_offset, bytes);  // the reference
        stream_copy(got.data() + kGuard + dst_offset, source.data() + src_offset, bytes);
        copy_bytes_streaming(through_gpu_h.data() + kGuard + dst_offset, source.data() + src_offset,
                             bytes);
        EXPECT_EQ(got, want) << bytes << " bytes, destination +" << dst_offset << ", source +"
                             << src_offset;
        EXPECT_EQ(through_gpu_h, want) << "copy_bytes_streaming, " << bytes << " bytes";
      }
    }
  }
}

TEST(StreamingCopy, ZeroLeavesMemsetsBytesAtEveryAlignmentAndNothingOutside) {
  std::mt19937_64 gen(20261207);
  for (const size_t bytes : kSizes) {
    for (const size_t offset : {size_t(0), size_t(1), size_t(16), size_t(33), size_t(63)}) {
      const std::vector<unsigned char> before = random_bytes(offset + bytes + 2 * kGuard, gen);
      std::vector<unsigned char> want = before, got = before, through_gpu_h = before;
      std::memset(want.data() + kGuard + offset, 0, bytes);  // the reference
      stream_zero(got.data() + kGuard + offset, bytes);
      zero_memory_streaming(through_gpu_h.data() + kGuard + offset, bytes, MemoryKind::Host);
      EXPECT_EQ(got, want) << bytes << " bytes at +" << offset;
      EXPECT_EQ(through_gpu_h, want) << "zero_memory_streaming, " << bytes << " bytes";
    }
  }
}

}  // namespace
}  // namespace rlf
