// Reference RMSNorm: out = inp * rstd * weight, rstd = 1 / sqrt(mean(inp^2) + eps).
#include "kernels/rmsnorm.h"

#include <cmath>
#include <cstdint>

namespace rlf::ref {

template <typename T>
void rmsnorm_forward(T* out, T* rstd, const T* inp, const T* weight, int N, int C, T eps) {
  for (int64_t n = 0; n < N; ++n) {
    const T* x = inp + n * C;
    T* y = out + n * C;
    T sum_sq = T(0);
    for (int64_t c = 0; c < C; ++c) sum_sq += x[c] * x[c];
    const T r = T(1) / std::sqrt(sum_sq / T(C) + eps);
    for (int64_t c = 0; c < C; ++c) y[c] = x[c] * r * weight[c];
    if (rstd) rstd[n] = r;
  }
}

// With y_c = x_c * r * w_c and r = (mean(x^2) + eps)^(-1/2), dr/dx_j = -r^3 x_j / C, so
//   dx_j = r * w_j * dy_j - r^3 * x_j / C * sum_c(dy_c * w_c * x_c),   dw_c = dy_c * x_c * r.
template <typename T>
void rmsnorm_backward(T* dinp, T* dweight, const T* dout, const T* inp, const T* weight,
                      const T* rstd, int N, int C) {
  for (int64_t n = 0; n < N; ++n) {
    const T* x = inp + n * C;
    const T* dy = dout + n * C;
    const T r = rstd[n];
    if (dinp) {
      T dot = T(0);
      for (int64_t c = 0; c < C; ++c) dot += dy[c] * weight[c] * x[c];
      const T scale = r * r * r * dot / T(C);
      for (int64_t c = 0; c < C; ++c) dinp[n * C + c] += r * weight[c] * dy[c] - scale * x[c];
    }
    if (dweight) {
      for (int64_t c = 0; c < C; ++c) dweight[c] += dy[c] * x[c] * r;
    }
  }
}

template void rmsnorm_forward<float>(float*, float*, const float*, const float*, int, int, float);
template void rmsnorm_forward<double>(double*, double*, const double*, const double*, int, int,
                                      double);
template void rmsnorm_backward<float>(float*, float*, const float*, const float*, const float*,
                                      const float*, int, int);
template void rmsnorm_backward<double>(double*, double*, const double*, const double*,
                                       const double*, const double*, int, int);

}  // namespace rlf::ref
