// One token's row of the top-k softmax router (the algorithm in kernels/router.h), shared by ref::
// and cpu:: so both backends route and differentiate with the same operations in the same order
// (bit-identical results for float). Internal to kernels/.
#pragma once

#include <cmath>

namespace rlf::detail {

// probs[E] = softmax(logits[E]); idx[K], weight[K]: the K largest probabilities, largest first
// (the strict comparison keeps the lower expert index on ties), renormalized to sum to 1 when
// normalize_topk.
template <typename T>
void router_forward_row(int* idx, T* weight, T* probs, const T* logits, int E, int K,
                        bool normalize_topk) {
  T mx = logits[0];
  for (int e = 1; e < E; ++e) mx = logits[e] > mx ? logits[e] : mx;
  T sum = 0;
  for (int e = 0; e < E; ++e) {
    probs[e] = std::exp(logits[e] - mx);
    sum += probs[e];
  }
  const T inv = T(1) / sum;
  for (int e = 0; e < E; ++e) probs[e] *= inv;
  // Top-k: repeatedly take the largest unselected probability.
  for (int k = 0; k < K; ++k) {
    int best = -1;
    for (int e = 0; e < E; ++e) {
      bool taken = false;
      for (int j = 0; j < k; ++j) taken = taken || idx[j] == e;
      if (taken) continue;
      if (best < 0 || probs[e] > probs[best]) best = e;
    }
    idx[k] = best;
    weight[k] = probs[best];
  }
  if (normalize_topk) {
    T s = 0;
    for (int k = 0; k < K; ++k) s += weight[k];
    for (int k = 0; k < K; ++k) weight[k] /= s;
  }
}

// dlogits[E] += the row's gradient at the logits, given probs[E], its top-k (idx, weight) and the
// gradients at its selected weights (dweight[K], or null) and at its probabilities (dprobs[E], or
// null). g[E]: work space.
template <typename T>
void router_backward_row(T* dlogits, T* g, const T* dweight, const T* dprobs, const T* probs,
                         const int* idx, const T* weight, int E, int K, bool normalize_topk) {
  // g = dloss/dprobs: the direct gradient plus the selected weights' gradient.
  for (int e = 0; e < E; ++e) g[e] = dprobs ? dprobs[e] : T(0);
  if (dweight) {
    if (normalize_topk) {
      // w_k = p_k / S, S = sum_j p_j: dp_j = (dw_j - sum_k dw_k w_k) / S.
      T s = 0, dot = 0;
      for (int k = 0; k < K; ++k) {
        s += probs[idx[k]];
        dot += dweight[k] * weight[k];
      }
      for (int k = 0; k < K; ++k) g[idx[k]] += (dweight[k] - dot) / s;
    } else {
      for (int k = 0; k < K; ++k) g[idx[k]] += dweight[k];
    }
  }
  // Softmax backward: dl_e = p_e * (g_e - sum_j g_j p_j).
  T dot = 0;
  for (int e = 0; e < E; ++e) dot += g[e] * probs[e];
  for (int e = 0; e < E; ++e) dlogits[e] += probs[e] * (g[e] - dot);
}

}  // namespace rlf::detail
