// Fast float RMSNorm. Rows are independent, so forward and dinp parallelize over fixed row
// chunks. dweight is a reduction over N: each fixed row block writes its own partial[C] (from
// scratch) and the partials are summed in block order, so results never depend on scheduling.
// Row sums use 16 float lanes (Eigen fixed-size packets) combined in a fixed order.
#include "kernels/rmsnorm.h"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/arena.h"
#include "kernels/parallel.h"

namespace rlf::cpu {
namespace {

using Lanes = Eigen::Array<float, 16, 1>;
using LanesMap = Eigen::Map<const Lanes>;

constexpr int64_t kMinChunkFloats = 1 << 14;  // elements per chunk, at least
constexpr int64_t kMaxRowBlocks = 16;         // dweight partials

// sum_c a[c] * a[c]
float sum_squares(const float* a, int64_t n) {
  Lanes acc = Lanes::Zero();
  int64_t c = 0;
  for (; c + 16 <= n; c += 16) acc += LanesMap(a + c).square();
  float sum = acc.sum();
  for (; c < n; ++c) sum += a[c] * a[c];
  return sum;
}

// sum_c a[c] * b[c] * d[c]
float sum_product3(const float* a, const float* b, const float* d, int64_t n) {
  Lanes acc = Lanes::Zero();
  int64_t c = 0;
  for (; c + 16 <= n; c += 16) acc += LanesMap(a + c) * LanesMap(b + c) * LanesMap(d + c);
  float sum = acc.sum();
  for (; c < n; ++c) sum += a[c] * b[c] * d[c];
  return sum;
}

int64_t row_grain(int N, int C) {
  return std::max<int64_t>(1, kMinChunkFloats / std::max(C, 1));
}

}  // namespace

void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int N, int C,
                     float eps, Arena& scratch) {
  if (N <= 0) return;
  parallel_for_chunks(N, row_grain(N, C), [&](int64_t b, int64_t e) {
    for (int64_t n = b; n < e; ++n) {
      const float* __restrict__ x = inp + n * C;
      float* __restrict__ y = out + n * C;
      const float r = 1.0f / std::sqrt(sum_squares(x, C) / float(C) + eps);
      for (int64_t c = 0; c < C; ++c) y[c] = x[c] * r * weight[c];
      if (rstd) rstd[n] = r;
    }
  });
}

void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                      const float* weight, const float* rstd, int N, int C, Arena& scratch) {
  if (N <= 0 || C <= 0 || (!dinp && !dweight)) return;
  ArenaScope scope(scratch);
  // Row blocks: a function of N and C only.
  const int64_t grain =
      std::max<int64_t>(row_grain(N, C), (int64_t(N) + kMaxRowBlocks - 1) / kMaxRowBlocks);
  const int64_t blocks = num_blocks(N, grain);
  float* partials = nullptr;
  if (dweight) {
    partials = scratch.allocate<float>(size_t(blocks) * size_t(C), "rmsnorm dweight partials");
  }
  parallel_for_chunks(N, grain, [&](int64_t b, int64_t e) {
    float* __restrict__ part = partials ? partials + (b / grain) * C : nullptr;
    if (part) std::fill(part, part + C, 0.0f);
    for (int64_t n = b; n < e; ++n) {
      const float* __restrict__ x = inp + n * C;
      const float* __restrict__ dy = dout + n * C;
      const float r = rstd[n];
      if (dinp) {
        const float scale = r * r * r * sum_product3(dy, weight, x, C) / float(C);
        float* __restrict__ dx = dinp + n * C;
        for (int64_t c = 0; c < C; ++c) dx[c] += r * weight[c] * dy[c] - scale * x[c];
      }
      if (part) {
        for (int64_t c = 0; c < C; ++c) part[c] += dy[c] * x[c] * r;
      }
    }
  });
  if (dweight) {
    parallel_for_chunks(C, 1024, [&](int64_t c0, int64_t c1) {
      // Block 0's partial accumulates blocks 1, 2, ... in order, then goes into dweight.
      float* __restrict__ sum = partials;
      for (int64_t k = 1; k < blocks; ++k) {
        const float* __restrict__ part = partials + k * C;
        for (int64_t c = c0; c < c1; ++c) sum[c] += part[c];
      }
      for (int64_t c = c0; c < c1; ++c) dweight[c] += sum[c];
    });
  }
}

}  // namespace rlf::cpu
