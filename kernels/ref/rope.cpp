// Reference rotary position embedding on [N, H, D]: pair (2i, 2i+1) of every head of token n is
// rotated by angle positions[n] * theta^(-2i/D). Angles, cos and sin are computed in double and
// then cast to T (the cpu:: version does the same, so the two agree closely).
#include "kernels/rope.h"

#include <cmath>
#include <cstdint>
#include <stdexcept>

namespace rlf::ref {
namespace {
void check_head_dim(int D) {
  if (D % 2 != 0) throw std::invalid_argument("rope: head dimension D must be even");
}
double rope_angle(int position, int i, int D, float theta) {
  return double(position) * std::pow(double(theta), -2.0 * i / D);
}
}  // namespace

template <typename T>
void rope_forward(T* out, const T* inp, const int* positions, int N, int H, int D, float theta) {
  check_head_dim(D);
  for (int64_t n = 0; n < N; ++n) {
    for (int i = 0; i < D / 2; ++i) {
      const double angle = rope_angle(positions[n], i, D, theta);
      const T c = T(std::cos(angle)), s = T(std::sin(angle));
      for (int64_t h = 0; h < H; ++h) {
        const int64_t k = (n * H + h) * D + 2 * i;
        const T x0 = inp[k], x1 = inp[k + 1];  // read both before writing: out may be inp
        out[k] = x0 * c - x1 * s;
        out[k + 1] = x0 * s + x1 * c;
      }
    }
  }
}

template <typename T>
void rope_backward(T* dinp, const T* dout, const int* positions, int N, int H, int D, float theta) {
  if (!dinp) return;
  check_head_dim(D);
  for (int64_t n = 0; n < N; ++n) {
    for (int i = 0; i < D / 2; ++i) {
      const double angle = rope_angle(positions[n], i, D, theta);
      const T c = T(std::cos(angle)), s = T(std::sin(angle));
      for (int64_t h = 0; h < H; ++h) {
        const int64_t k = (n * H + h) * D + 2 * i;
        const T g0 = dout[k], g1 = dout[k + 1];
        dinp[k] += g0 * c + g1 * s;
        dinp[k + 1] += g1 * c - g0 * s;
      }
    }
  }
}

template void rope_forward<float>(float*, const float*, const int*, int, int, int, float);
template void rope_forward<double>(double*, const double*, const int*, int, int, int, float);
template void rope_backward<float>(float*, const float*, const int*, int, int, int, float);
template void rope_backward<double>(double*, const double*, const int*, int, int, int, float);

}  // namespace rlf::ref
