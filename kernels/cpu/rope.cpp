// Fast float rotary position embedding. cos/sin come from a table built once per call (from
// scratch): one row per distinct position when the positions span a range no longer than N
// (packed sequences and decode batches repeat positions), else one row per token. Angles are
// computed in double and cast to float exactly as in ref::. There is no reduction, so the
// result is bit-identical whatever the thread count.
#include "kernels/rope.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>

#include "kernels/arena.h"
#include "kernels/parallel.h"

namespace rlf::cpu {
namespace {

constexpr int64_t kMinChunkFloats = 1 << 14;

struct RopeTable {
  const float* cos = nullptr;  // [rows, D/2]
  const float* sin = nullptr;
  int64_t base = 0;  // row of token n: positions[n] - base, or n when by_token
  bool by_token = false;
  int64_t row(const int* positions, int64_t n) const {
    return by_token ? n : int64_t(positions[n]) - base;
  }
};

RopeTable build_table(const int* positions, int N, int D, float theta, Arena& scratch) {
  if (D % 2 != 0) throw std::invalid_argument("rope: head dimension D must be even");
  const int64_t half = D / 2;
  int64_t lo = positions[0], hi = positions[0];
  for (int64_t n = 1; n < N; ++n) {
    lo = std::min<int64_t>(lo, positions[n]);
    hi = std::max<int64_t>(hi, positions[n]);
  }
  RopeTable table;
  table.by_token = hi - lo + 1 > N;
  table.base = lo;
  const int64_t rows = table.by_token ? N : hi - lo + 1;
  double* inv_freq = scratch.allocate<double>(size_t(std::max<int64_t>(half, 1)), "rope freqs");
  for (int64_t i = 0; i < half; ++i) inv_freq[i] = std::pow(double(theta), -2.0 * double(i) / D);
  float* cos_table = scratch.allocate<float>(size_t(rows * half), "rope cos");
  float* sin_table = scratch.allocate<float>(size_t(rows * half), "rope sin");
  const int64_t grain = std::max<int64_t>(1, 1024 / std::max<int64_t>(half, 1));
  parallel_for_chunks(rows, grain, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const double position = table.by_token ? double(positions[r]) : double(lo + r);
      for (int64_t i = 0; i < half; ++i) {
        const double angle = position * inv_freq[i];
        cos_table[r * half + i] = float(std::cos(angle));
        sin_table[r * half + i] = float(std::sin(angle));
      }
    }
  });
  table.cos = cos_table;
  table.sin = sin_table;
  return table;
}

// Rotates every head of every token by its position's angle. Forward writes the rotation
// (out may be inp: each pair is read before it is written); the backward pass adds the
// transposed rotation (angle negated) into its output, as every backward does.
template <bool kBackward>
void rotate(float* out, const float* inp, const int* positions, int N, int H, int D, float theta,
            Arena& scratch) {
  ArenaScope scope(scratch);
  const RopeTable table = build_table(positions, N, D, theta, scratch);
  const int64_t half = D / 2;
  const int64_t grain = std::max<int64_t>(1, kMinChunkFloats / (int64_t(H) * D));
  parallel_for_chunks(N, grain, [&](int64_t b, int64_t e) {
    for (int64_t n = b; n < e; ++n) {
      const int64_t row = table.row(positions, n);
      const float* __restrict__ cs = table.cos + row * half;
      const float* __restrict__ sn = table.sin + row * half;
      for (int64_t h = 0; h < H; ++h) {
        const float* x = inp + (n * H + h) * D;
        float* y = out + (n * H + h) * D;
        for (int64_t i = 0; i < half; ++i) {
          const float x0 = x[2 * i], x1 = x[2 * i + 1];
          if constexpr (kBackward) {
            y[2 * i] += x0 * cs[i] + x1 * sn[i];
            y[2 * i + 1] += x1 * cs[i] - x0 * sn[i];
          } else {
            y[2 * i] = x0 * cs[i] - x1 * sn[i];
            y[2 * i + 1] = x0 * sn[i] + x1 * cs[i];
          }
        }
      }
    }
  });
}

}  // namespace

void rope_forward(float* out, const float* inp, const int* positions, int N, int H, int D,
                  float theta, Arena& scratch) {
  if (N <= 0 || H <= 0 || D <= 0) return;
  rotate<false>(out, inp, positions, N, H, D, theta, scratch);
}

void rope_backward(float* dinp, const float* dout, const int* positions, int N, int H, int D,
                   float theta, Arena& scratch) {
  if (!dinp || N <= 0 || H <= 0 || D <= 0) return;
  rotate<true>(dinp, dout, positions, N, H, D, theta, scratch);
}

}  // namespace rlf::cpu
