// Reference top-k softmax router and auxiliary load-balancing loss (the specification).
#include "kernels/router.h"

#include <cmath>
#include <cstdint>
#include <vector>

namespace rlf::ref {

template <typename T>
void router_forward(int* expert_idx, T* expert_weight, T* probs, const T* logits, int N, int E,
                    int K, bool normalize_topk) {
  for (int64_t n = 0; n < N; ++n) {
    const T* l = logits + n * E;
    T* p = probs + n * E;
    // Softmax.
    T mx = l[0];
    for (int e = 1; e < E; ++e) mx = l[e] > mx ? l[e] : mx;
    T sum = 0;
    for (int e = 0; e < E; ++e) {
      p[e] = std::exp(l[e] - mx);
      sum += p[e];
    }
    const T inv = T(1) / sum;
    for (int e = 0; e < E; ++e) p[e] *= inv;
    // Top-k: repeatedly take the largest unselected probability; the strict comparison keeps
    // the lower expert index on ties.
    int* idx = expert_idx + n * K;
    T* w = expert_weight + n * K;
    for (int k = 0; k < K; ++k) {
      int best = -1;
      for (int e = 0; e < E; ++e) {
        bool taken = false;
        for (int j = 0; j < k; ++j) taken = taken || idx[j] == e;
        if (taken) continue;
        if (best < 0 || p[e] > p[best]) best = e;
      }
      idx[k] = best;
      w[k] = p[best];
    }
    if (normalize_topk) {
      T s = 0;
      for (int k = 0; k < K; ++k) s += w[k];
      for (int k = 0; k < K; ++k) w[k] /= s;
    }
  }
}

template <typename T>
void router_backward(T* dlogits, const T* dexpert_weight, const T* dprobs, const T* probs,
                     const int* expert_idx, const T* expert_weight, int N, int E, int K,
                     bool normalize_topk) {
  if (!dlogits) return;
  std::vector<T> g(E);
  for (int64_t n = 0; n < N; ++n) {
    const T* p = probs + n * E;
    const int* idx = expert_idx + n * K;
    const T* w = expert_weight + n * K;
    const T* dw = dexpert_weight ? dexpert_weight + n * K : nullptr;
    // g = dloss/dprobs[n, :]: the direct gradient plus the selected weights' gradient.
    for (int e = 0; e < E; ++e) g[e] = dprobs ? dprobs[n * E + e] : T(0);
    if (dw) {
      if (normalize_topk) {
        // w_k = p_k / S, S = sum_j p_j: dp_j = (dw_j - sum_k dw_k w_k) / S.
        T s = 0, dot = 0;
        for (int k = 0; k < K; ++k) {
          s += p[idx[k]];
          dot += dw[k] * w[k];
        }
        for (int k = 0; k < K; ++k) g[idx[k]] += (dw[k] - dot) / s;
      } else {
        for (int k = 0; k < K; ++k) g[idx[k]] += dw[k];
      }
    }
    // Softmax backward: dl_e = p_e * (g_e - sum_j g_j p_j).
    T dot = 0;
    for (int e = 0; e < E; ++e) dot += g[e] * p[e];
    for (int e = 0; e < E; ++e) dlogits[n * E + e] += p[e] * (g[e] - dot);
  }
}

template <typename T>
T router_aux_loss_forward(const T* probs, const int* expert_idx, int N, int E, int K) {
  std::vector<int64_t> count(E, 0);
  for (int64_t i = 0; i < int64_t(N) * K; ++i) ++count[expert_idx[i]];
  std::vector<T> psum(E, T(0));
  for (int64_t n = 0; n < N; ++n)
    for (int e = 0; e < E; ++e) psum[e] += probs[n * E + e];
  T loss = 0;
  for (int e = 0; e < E; ++e) {
    const T f = T(count[e]) / T(int64_t(N) * K);
    const T P = psum[e] / T(N);
    loss += f * P;
  }
  return T(E) * loss;
}

template <typename T>
void router_aux_loss_backward(T* dprobs, T dloss, const int* expert_idx, int N, int E, int K) {
  if (!dprobs) return;
  std::vector<int64_t> count(E, 0);
  for (int64_t i = 0; i < int64_t(N) * K; ++i) ++count[expert_idx[i]];
  for (int e = 0; e < E; ++e) {
    const T f = T(count[e]) / T(int64_t(N) * K);
    const T g = dloss * T(E) * f / T(N);
    for (int64_t n = 0; n < N; ++n) dprobs[n * E + e] += g;
  }
}

template void router_forward<float>(int*, float*, float*, const float*, int, int, int, bool);
template void router_forward<double>(int*, double*, double*, const double*, int, int, int, bool);
template void router_backward<float>(float*, const float*, const float*, const float*, const int*,
                                     const float*, int, int, int, bool);
template void router_backward<double>(double*, const double*, const double*, const double*,
                                      const int*, const double*, int, int, int, bool);
template float router_aux_loss_forward<float>(const float*, const int*, int, int, int);
template double router_aux_loss_forward<double>(const double*, const int*, int, int, int);
template void router_aux_loss_backward<float>(float*, float, const int*, int, int, int);
template void router_aux_loss_backward<double>(double*, double, const int*, int, int, int);

}  // namespace rlf::ref
