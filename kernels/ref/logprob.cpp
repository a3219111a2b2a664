// Reference log-softmax / per-token log-prob: plain loops, numerically stable (row max first).
#include "kernels/logprob.h"

#include <cmath>
#include <cstdint>

namespace rlf::ref {
namespace {

template <typename T>
T row_logsumexp(const T* x, int V) {
  T max = x[0];
  for (int v = 1; v < V; ++v) max = x[v] > max ? x[v] : max;
  T sum = 0;
  for (int v = 0; v < V; ++v) sum += std::exp(x[v] - max);
  return max + std::log(sum);
}

}  // namespace

template <typename T>
void log_softmax_forward(T* out, const T* logits, int N, int V) {
  if (V <= 0) return;
  for (int64_t n = 0; n < N; ++n) {
    const T* x = logits + n * V;
    const T lse = row_logsumexp(x, V);
    for (int v = 0; v < V; ++v) out[n * V + v] = x[v] - lse;
  }
}

template <typename T>
void logprob_forward(T* logp, T* lse, const T* logits, const int* targets, int N, int V) {
  if (V <= 0) return;
  for (int64_t n = 0; n < N; ++n) {
    const T* x = logits + n * V;
    const T row_lse = row_logsumexp(x, V);
    if (lse) lse[n] = row_lse;
    logp[n] = x[targets[n]] - row_lse;
  }
}

template <typename T>
void logprob_backward(T* dlogits, const T* dlogp, const T* logits, const T* lse, const int* targets,
                      int N, int V) {
  if (!dlogits || V <= 0) return;
  for (int64_t n = 0; n < N; ++n) {
    const T* x = logits + n * V;
    T* dx = dlogits + n * V;
    for (int v = 0; v < V; ++v) {
      const T p = std::exp(x[v] - lse[n]);
      const T indicator = v == targets[n] ? T(1) : T(0);
      dx[v] += dlogp[n] * (indicator - p);
    }
  }
}

template void log_softmax_forward<float>(float*, const float*, int, int);
template void log_softmax_forward<double>(double*, const double*, int, int);
template void logprob_forward<float>(float*, float*, const float*, const int*, int, int);
template void logprob_forward<double>(double*, double*, const double*, const int*, int, int);
template void logprob_backward<float>(float*, const float*, const float*, const float*, const int*,
                                      int, int);
template void logprob_backward<double>(double*, const double*, const double*, const double*,
                                       const int*, int, int);

}  // namespace rlf::ref
