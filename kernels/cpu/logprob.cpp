// Fast log-softmax / per-token log-prob: rows in parallel (each row is independent, so results do
// not depend on the thread count); Eigen's vectorized max / exp / sum inside a row.
#include "kernels/logprob.h"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/arena.h"
#include "kernels/parallel.h"

namespace rlf::cpu {
namespace {

using ConstRow = Eigen::Map<const Eigen::ArrayXf>;
using Row = Eigen::Map<Eigen::ArrayXf>;

// Rows per parallel chunk: about 16K logits of work per chunk.
int64_t row_grain(int V) {
  return std::max<int64_t>(1, int64_t(16384) / std::max(1, V));
}

float row_logsumexp(const ConstRow& x) {
  const float max = x.maxCoeff();
  const float sum = (x - max).exp().sum();
  return max + std::log(sum);
}

}  // namespace

void log_softmax_forward(float* out, const float* logits, int N, int V, Arena& /*scratch*/) {
  if (N <= 0 || V <= 0) return;
  parallel_for_chunks(N, row_grain(V), [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      const ConstRow x(logits + n * V, V);
      const float lse = row_logsumexp(x);
      Row(out + n * V, V) = x - lse;
    }
  });
}

void logprob_forward(float* logp, float* lse, const float* logits, const int* targets, int N, int V,
                     Arena& /*scratch*/) {
  if (N <= 0 || V <= 0) return;
  parallel_for_chunks(N, row_grain(V), [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      const ConstRow x(logits + n * V, V);
      const float row_lse = row_logsumexp(x);
      if (lse) lse[n] = row_lse;
      logp[n] = x[targets[n]] - row_lse;
    }
  });
}

void logprob_backward(float* dlogits, const float* dlogp, const float* logits, const float* lse,
                      const int* targets, int N, int V, Arena& /*scratch*/) {
  if (!dlogits || N <= 0 || V <= 0) return;
  parallel_for_chunks(N, row_grain(V), [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      const ConstRow x(logits + n * V, V);
      Row dx(dlogits + n * V, V);
      const float g = dlogp[n];
      dx -= g * (x - lse[n]).exp();
      dx[targets[n]] += g;
    }
  });
}

}  // namespace rlf::cpu
