// Fast float token embedding. Forward copies rows in parallel over tokens. Backward splits the
// channels into fixed ranges: each chunk walks all tokens in order n = 0..N-1 and adds its
// channel range of dout into dtable, so every element of dtable is accumulated in token order
// by exactly one chunk (bit-identical to ref:: and to any thread count).
#include "kernels/embedding.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#include "kernels/arena.h"
#include "kernels/parallel.h"

namespace rlf::cpu {
namespace {

void check_tokens(const int* tokens, int N, int V) {
  for (int64_t n = 0; n < N; ++n) {
    if (tokens[n] < 0 || tokens[n] >= V) {
      throw std::out_of_range("embedding: token " + std::to_string(tokens[n]) + " at position " +
                              std::to_string(n) + " is outside the vocabulary [0, " +
                              std::to_string(V) + ")");
    }
  }
}

constexpr int64_t kForwardChunkFloats = 1 << 16;  // ~256 KiB copied per chunk
constexpr int64_t kMaxChannelChunks = 4;
constexpr int64_t kMinChannelChunk = 64;         // floats: whole cache lines per token row
constexpr int64_t kMinBackwardFloats = 1 << 15;  // below this one chunk does everything

}  // namespace

void embedding_forward(float* out, const int* tokens, const float* table, int N, int C, int V,
                       Arena& scratch) {
  if (N <= 0 || C <= 0) return;
  check_tokens(tokens, N, V);
  const int64_t grain = std::max<int64_t>(1, kForwardChunkFloats / C);
  parallel_for_chunks(N, grain, [&](int64_t b, int64_t e) {
    for (int64_t n = b; n < e; ++n) {
      std::memcpy(out + n * C, table + int64_t(tokens[n]) * C, sizeof(float) * size_t(C));
    }
  });
}

void embedding_backward(float* dtable, const float* dout, const int* tokens, int N, int C, int V,
                        Arena& scratch) {
  if (!dtable || N <= 0 || C <= 0) return;
  check_tokens(tokens, N, V);
  int64_t chunks = std::min<int64_t>(kMaxChannelChunks, C / kMinChannelChunk);
  if (int64_t(N) * C < kMinBackwardFloats) chunks = 1;
  chunks = std::max<int64_t>(chunks, 1);
  int64_t grain = (C + chunks - 1) / chunks;
  grain = std::min<int64_t>(C, (grain + 15) / 16 * 16);  // 64-byte multiples
  parallel_for_chunks(C, grain, [&](int64_t c0, int64_t c1) {
    const int64_t width = c1 - c0;
    for (int64_t n = 0; n < N; ++n) {
      float* __restrict__ dst = dtable + int64_t(tokens[n]) * C + c0;
      const float* __restrict__ src = dout + n * C + c0;
      for (int64_t c = 0; c < width; ++c) dst[c] += src[c];
    }
  });
}

}  // namespace rlf::cpu
