// Fast AdamW and global gradient norm.
// grad_norm_squared: fixed blocks of kBlock elements, one double partial per block (written by
// whichever thread runs the block), summed serially in block order: thread-count independent.
// adamw_update: elementwise, the same float operations as ref::adamw_update<float>.
#include "kernels/adamw.h"

#include <Eigen/Core>
#include <cmath>
#include <cstdint>

#include "kernels/arena.h"
#include "kernels/parallel.h"

namespace rlf::cpu {
namespace {
constexpr int64_t kBlock = int64_t(1) << 16;        // elements per norm partial
constexpr int64_t kUpdateGrain = int64_t(1) << 15;  // elements per update chunk
}  // namespace

double grad_norm_squared(const float* grad, int64_t n, Arena& scratch) {
  if (n <= 0) return 0.0;
  ArenaScope scope(scratch);
  const int64_t blocks = num_blocks(n, kBlock);
  double* partials = scratch.allocate<double>(size_t(blocks), "grad_norm_squared partials");
  parallel_for_chunks(n, kBlock, [&](int64_t begin, int64_t end) {
    const Eigen::Map<const Eigen::ArrayXf> g(grad + begin, end - begin);
    partials[begin / kBlock] = g.cast<double>().square().sum();
  });
  double sum = 0;
  for (int64_t b = 0; b < blocks; ++b) sum += partials[b];
  return sum;
}

void adamw_update(float* param, const float* grad, float* m, float* v, int64_t n,
                  const AdamWHyper& hyper, int step, float grad_scale, Arena& /*scratch*/) {
  if (n <= 0) return;
  const float b1 = hyper.beta1, b2 = hyper.beta2;
  const float lr = hyper.learning_rate, eps = hyper.eps, wd = hyper.weight_decay;
  const float scale = grad_scale;
  const float bc1 = float(1.0 - std::pow(double(hyper.beta1), double(step)));
  const float bc2 = float(1.0 - std::pow(double(hyper.beta2), double(step)));
  const float one_minus_b1 = 1.0f - b1, one_minus_b2 = 1.0f - b2;
  // A plain loop with the reference's float operations in the same order (same results as
  // ref::adamw_update<float> up to the compiler's FMA contraction, identical with GCC 12 here).
  // Not Eigen: its vectorized float sqrt is an approximation (rsqrt + Newton) under
  // EIGEN_FAST_MATH. The scalar sqrt keeps this loop unvectorized, but it is memory-bound anyway.
  parallel_for_chunks(n, kUpdateGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float g = grad[i] * scale;
      m[i] = b1 * m[i] + one_minus_b1 * g;
      v[i] = b2 * v[i] + one_minus_b2 * (g * g);
      const float mhat = m[i] / bc1;
      const float vhat = v[i] / bc2;
      param[i] -= lr * (mhat / (std::sqrt(vhat) + eps) + wd * param[i]);
    }
  });
}

}  // namespace rlf::cpu
