// Fast AdamW and global gradient norm.
// grad_norm_squared: fixed blocks of kBlock elements, one double partial per block (written by
// whichever thread runs the block), summed serially in block order: thread-count independent;
// inside a block, kLanes running sums in a fixed order (sum_of_squares).
// adamw_update: elementwise, the same float operations as ref::adamw_update<float>.
#include "kernels/adamw.h"

#include <cmath>
#include <cstdint>

#include "kernels/arena.h"
#include "kernels/parallel.h"

namespace rlf::cpu {
namespace {
constexpr int64_t kBlock = int64_t(1) << 16;        // elements per norm partial
constexpr int64_t kUpdateGrain = int64_t(1) << 15;  // elements per update chunk

constexpr int kLanes = 16;  // running sums inside a norm block

// The squares of x[0, n) summed in double: element i goes to running sum i mod kLanes, the sums
// added pairwise at the end, the tail after them. Independent sums let the compiler keep them in
// vector registers (four 4-wide FMA chains, no reassociation needed: the same bits at any
// optimization level); a single running sum, or Eigen's cast<double>().square().sum() (5 ms per
// 4M floats here, 3.3 GB/s), is bound by the conversions and the chain instead of memory.
double sum_of_squares(const float* __restrict x, int64_t n) {
  double lanes[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) {
      const double value = x[i + j];
      lanes[j] += value * value;
    }
  }
  for (int width = kLanes / 2; width >= 1; width /= 2) {
    for (int j = 0; j < width; ++j) lanes[j] += lanes[j + width];
  }
  double sum = lanes[0];
  for (; i < n; ++i) sum += double(x[i]) * double(x[i]);
  return sum;
}

struct UpdateConstants {
  float b1, b2, lr, eps, wd, scale, bc1, bc2, one_minus_b1, one_minus_b2;
};

UpdateConstants update_constants(const AdamWHyper& hyper, int step, float grad_scale) {
  UpdateConstants k{};
  k.b1 = hyper.beta1;
  k.b2 = hyper.beta2;
  k.lr = hyper.learning_rate;
  k.eps = hyper.eps;
  k.wd = hyper.weight_decay;
  k.scale = grad_scale;
  k.bc1 = float(1.0 - std::pow(double(hyper.beta1), double(step)));
  k.bc2 = float(1.0 - std::pow(double(hyper.beta2), double(step)));
  k.one_minus_b1 = 1.0f - k.b1;
  k.one_minus_b2 = 1.0f - k.b2;
  return k;
}

// A plain loop with the reference's float operations in the same order (same results as
// ref::adamw_update<float> up to the compiler's FMA contraction, identical with GCC 12 here).
// Not Eigen: its vectorized float sqrt is an approximation (rsqrt + Newton) under
// EIGEN_FAST_MATH. The compiler vectorizes this loop itself, with the exact (IEEE, correctly
// rounded) vector sqrt and division, so the bits are the scalar loop's: that takes the
// non-aliasing pointers below and -fno-math-errno for this file (kernels/CMakeLists.txt), without
// which a sqrt call may set errno and stays scalar. Scalar, the divisions and the sqrt bound it
// at about 6 ns per parameter, 5 GB/s of its 28 bytes, a quarter of the memory bandwidth;
// vectorized it runs about 6x faster (`bench kernels`, row `adamw update`).
void update_range(float* __restrict param, const float* __restrict grad, float* __restrict m,
                  float* __restrict v, int64_t n, const UpdateConstants& c) {
  const UpdateConstants k = c;  // locals: not re-read from memory the stores might alias
  for (int64_t i = 0; i < n; ++i) {
    const float g = grad[i] * k.scale;
    m[i] = k.b1 * m[i] + k.one_minus_b1 * g;
    v[i] = k.b2 * v[i] + k.one_minus_b2 * (g * g);
    const float mhat = m[i] / k.bc1;
    const float vhat = v[i] / k.bc2;
    param[i] -= k.lr * (mhat / (std::sqrt(vhat) + k.eps) + k.wd * param[i]);
  }
}
}  // namespace

double grad_norm_squared(const float* grad, int64_t n, Arena& scratch) {
  if (n <= 0) return 0.0;
  ArenaScope scope(scratch);
  const int64_t blocks = num_blocks(n, kBlock);
  double* partials = scratch.allocate<double>(size_t(blocks), "grad_norm_squared partials");
  parallel_for_chunks(n, kBlock, [&](int64_t begin, int64_t end) {
    partials[begin / kBlock] = sum_of_squares(grad + begin, end - begin);
  });
  double sum = 0;
  for (int64_t b = 0; b < blocks; ++b) sum += partials[b];
  return sum;
}

void adamw_update(float* param, const float* grad, float* m, float* v, int64_t n,
                  const AdamWHyper& hyper, int step, float grad_scale, Arena& /*scratch*/) {
  if (n <= 0) return;
  const UpdateConstants k = update_constants(hyper, step, grad_scale);
  parallel_for_chunks(n, kUpdateGrain, [&](int64_t begin, int64_t end) {
    update_range(param + begin, grad + begin, m + begin, v + begin, end - begin, k);
  });
}

}  // namespace rlf::cpu
