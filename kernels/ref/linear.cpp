// Reference dense matmul: plain loops, the specification for cpu::matmul_*.
#include "kernels/linear.h"

#include <cstdint>

namespace rlf::ref {

template <typename T>
void matmul_forward(T* out, const T* inp, const T* weight, int N, int C, int OC) {
  for (int64_t n = 0; n < N; ++n) {
    const T* x = inp + n * C;
    for (int64_t o = 0; o < OC; ++o) {
      const T* w = weight + o * C;
      T sum = T(0);
      for (int64_t c = 0; c < C; ++c) sum += x[c] * w[c];
      out[n * OC + o] = sum;
    }
  }
}

template <typename T>
void matmul_backward(T* dinp, T* dweight, const T* dout, const T* inp, const T* weight, int N,
                     int C, int OC) {
  // dinp[n, c] += sum_o dout[n, o] * weight[o, c]
  if (dinp) {
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t c = 0; c < C; ++c) {
        T sum = T(0);
        for (int64_t o = 0; o < OC; ++o) sum += dout[n * OC + o] * weight[o * C + c];
        dinp[n * C + c] += sum;
      }
    }
  }
  // dweight[o, c] += sum_n dout[n, o] * inp[n, c]
  if (dweight) {
    for (int64_t o = 0; o < OC; ++o) {
      for (int64_t c = 0; c < C; ++c) {
        T sum = T(0);
        for (int64_t n = 0; n < N; ++n) sum += dout[n * OC + o] * inp[n * C + c];
        dweight[o * C + c] += sum;
      }
    }
  }
}

template void matmul_forward<float>(float*, const float*, const float*, int, int, int);
template void matmul_forward<double>(double*, const double*, const double*, int, int, int);
template void matmul_backward<float>(float*, float*, const float*, const float*, const float*, int,
                                     int, int);
template void matmul_backward<double>(double*, double*, const double*, const double*, const double*,
                                      int, int, int);

}  // namespace rlf::ref
