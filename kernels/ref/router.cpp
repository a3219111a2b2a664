// Reference top-k softmax router and auxiliary load-balancing loss (the specification).
#include "kernels/router.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/router_row.h"

namespace rlf::ref {

template <typename T>
void router_forward(int* expert_idx, T* expert_weight, T* probs, const T* logits, int N, int E,
                    int K, bool normalize_topk) {
  for (int64_t n = 0; n < N; ++n) {
    detail::router_forward_row(expert_idx + n * K, expert_weight + n * K, probs + n * E,
                               logits + n * E, E, K, normalize_topk);
  }
}

template <typename T>
void router_backward(T* dlogits, const T* dexpert_weight, const T* dprobs, const T* probs,
                     const int* expert_idx, const T* expert_weight, int N, int E, int K,
                     bool normalize_topk) {
  if (!dlogits) return;
  std::vector<T> g(E);
  for (int64_t n = 0; n < N; ++n) {
    detail::router_backward_row(dlogits + n * E, g.data(),
                                dexpert_weight ? dexpert_weight + n * K : nullptr,
                                dprobs ? dprobs + n * E : nullptr, probs + n * E,
                                expert_idx + n * K, expert_weight + n * K, E, K, normalize_topk);
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
