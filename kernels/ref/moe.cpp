// Reference MoE gather/combine and grouped SwiGLU expert FFN (the specification).
#include "kernels/moe.h"

#include <cmath>
#include <cstdint>
#include <vector>

namespace rlf::ref {
namespace {
template <typename T>
T sigmoid(T x) {
  return T(1) / (T(1) + std::exp(-x));
}
}  // namespace

template <typename T>
void moe_gather(T* xg, const T* x, const int* token_of_row, int M, int C) {
  for (int64_t m = 0; m < M; ++m) {
    const int64_t n = token_of_row[m];
    for (int64_t c = 0; c < C; ++c) xg[m * C + c] = x[n * C + c];
  }
}

template <typename T>
void moe_gather_backward(T* dx, const T* dxg, const int* row_of_assignment, int N, int K, int C) {
  if (!dx) return;
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t c = 0; c < C; ++c) {
      T s = 0;
      for (int64_t k = 0; k < K; ++k) s += dxg[int64_t(row_of_assignment[n * K + k]) * C + c];
      dx[n * C + c] += s;
    }
  }
}

template <typename T>
void moe_combine(T* out, const T* y, const T* expert_weight, const int* row_of_assignment, int N,
                 int K, int C) {
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t c = 0; c < C; ++c) {
      T s = 0;
      for (int64_t k = 0; k < K; ++k)
        s += expert_weight[n * K + k] * y[int64_t(row_of_assignment[n * K + k]) * C + c];
      out[n * C + c] = s;
    }
  }
}

template <typename T>
void moe_combine_backward(T* dy, T* dexpert_weight, const T* dout, const T* y,
                          const T* expert_weight, const int* row_of_assignment, int N, int K,
                          int C) {
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t k = 0; k < K; ++k) {
      const int64_t row = row_of_assignment[n * K + k];
      const T w = expert_weight[n * K + k];
      if (dy)
        for (int64_t c = 0; c < C; ++c) dy[row * C + c] += w * dout[n * C + c];
      if (dexpert_weight) {
        T dot = 0;
        for (int64_t c = 0; c < C; ++c) dot += dout[n * C + c] * y[row * C + c];
        dexpert_weight[n * K + k] += dot;
      }
    }
  }
}

template <typename T>
void expert_ffn_forward(T* y, T* a, T* b, const T* xg, const T* const* w1, const T* const* w3,
                        const T* const* w2, const int* expert_offsets, int E, int C, int F) {
  std::vector<T> h(F);
  for (int64_t e = 0; e < E; ++e) {
    const T* W1 = w1[e];
    const T* W3 = w3[e];
    const T* W2 = w2[e];
    for (int64_t m = expert_offsets[e]; m < expert_offsets[e + 1]; ++m) {
      const T* xr = xg + m * C;
      for (int64_t f = 0; f < F; ++f) {
        T sa = 0, sb = 0;
        for (int64_t c = 0; c < C; ++c) {
          sa += xr[c] * W1[f * C + c];
          sb += xr[c] * W3[f * C + c];
        }
        a[m * F + f] = sa;
        b[m * F + f] = sb;
        h[f] = sa * sigmoid(sa) * sb;  // silu(a) * b
      }
      for (int64_t c = 0; c < C; ++c) {
        T s = 0;
        for (int64_t f = 0; f < F; ++f) s += h[f] * W2[c * F + f];
        y[m * C + c] = s;
      }
    }
  }
}

template <typename T>
void expert_ffn_backward(T* dxg, T* const* dw1, T* const* dw3, T* const* dw2, const T* dy,
                         const T* xg, const T* a, const T* b, const T* const* w1,
                         const T* const* w3, const T* const* w2, const int* expert_offsets, int E,
                         int C, int F) {
  std::vector<T> h(F), dh(F), da(F), db(F);
  for (int64_t e = 0; e < E; ++e) {
    const T* W1 = w1[e];
    const T* W3 = w3[e];
    const T* W2 = w2[e];
    T* dW1 = dw1 ? dw1[e] : nullptr;
    T* dW3 = dw3 ? dw3[e] : nullptr;
    T* dW2 = dw2 ? dw2[e] : nullptr;
    for (int64_t m = expert_offsets[e]; m < expert_offsets[e + 1]; ++m) {
      const T* xr = xg + m * C;
      const T* dyr = dy + m * C;
      for (int64_t f = 0; f < F; ++f) {
        const T av = a[m * F + f], bv = b[m * F + f];
        const T s = sigmoid(av);
        h[f] = av * s * bv;
        // dh = dy @ W2_e
        T acc = 0;
        for (int64_t c = 0; c < C; ++c) acc += dyr[c] * W2[c * F + f];
        dh[f] = acc;
        // silu'(a) = s * (1 + a * (1 - s))
        da[f] = acc * bv * s * (T(1) + av * (T(1) - s));
        db[f] = acc * av * s;
      }
      if (dW2)
        for (int64_t c = 0; c < C; ++c)
          for (int64_t f = 0; f < F; ++f) dW2[c * F + f] += dyr[c] * h[f];
      for (int64_t f = 0; f < F; ++f) {
        for (int64_t c = 0; c < C; ++c) {
          if (dW1) dW1[f * C + c] += da[f] * xr[c];
          if (dW3) dW3[f * C + c] += db[f] * xr[c];
        }
      }
      if (dxg) {
        for (int64_t c = 0; c < C; ++c) {
          T s = 0;
          for (int64_t f = 0; f < F; ++f) s += da[f] * W1[f * C + c] + db[f] * W3[f * C + c];
          dxg[m * C + c] += s;
        }
      }
    }
  }
}

template void moe_gather<float>(float*, const float*, const int*, int, int);
template void moe_gather<double>(double*, const double*, const int*, int, int);
template void moe_gather_backward<float>(float*, const float*, const int*, int, int, int);
template void moe_gather_backward<double>(double*, const double*, const int*, int, int, int);
template void moe_combine<float>(float*, const float*, const float*, const int*, int, int, int);
template void moe_combine<double>(double*, const double*, const double*, const int*, int, int, int);
template void moe_combine_backward<float>(float*, float*, const float*, const float*, const float*,
                                          const int*, int, int, int);
template void moe_combine_backward<double>(double*, double*, const double*, const double*,
                                           const double*, const int*, int, int, int);
template void expert_ffn_forward<float>(float*, float*, float*, const float*, const float* const*,
                                        const float* const*, const float* const*, const int*, int,
                                        int, int);
template void expert_ffn_forward<double>(double*, double*, double*, const double*,
                                         const double* const*, const double* const*,
                                         const double* const*, const int*, int, int, int);
template void expert_ffn_backward<float>(float*, float* const*, float* const*, float* const*,
                                         const float*, const float*, const float*, const float*,
                                         const float* const*, const float* const*,
                                         const float* const*, const int*, int, int, int);
template void expert_ffn_backward<double>(double*, double* const*, double* const*, double* const*,
                                          const double*, const double*, const double*,
                                          const double*, const double* const*, const double* const*,
                                          const double* const*, const int*, int, int, int);

}  // namespace rlf::ref
