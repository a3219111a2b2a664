// Top-k softmax router and the auxiliary load-balancing loss (Switch Transformer form).
//   probs[N, E] = softmax(logits[N, E]) per token;
//   expert_idx[N, K] = the K largest probabilities, descending (ties: lower expert index first);
//   expert_weight[N, K] = the selected probabilities, divided by their sum when normalize_topk.
//   aux loss = E * sum_e f_e * P_e, f_e = (assignments to e) / (N * K), P_e = mean_n probs[n, e].
// f_e is a count and carries no gradient.
#pragma once

namespace rlf {
class Arena;

namespace ref {
template <typename T>
void router_forward(int* expert_idx, T* expert_weight, T* probs, const T* logits, int N, int E,
                    int K, bool normalize_topk);
// dlogits[N, E] += d(loss)/d(logits) given dexpert_weight[N, K] and (optionally, may be null)
// dprobs[N, E], a gradient arriving directly at probs (from the aux loss).
template <typename T>
void router_backward(T* dlogits, const T* dexpert_weight, const T* dprobs, const T* probs,
                     const int* expert_idx, const T* expert_weight, int N, int E, int K,
                     bool normalize_topk);
template <typename T>
T router_aux_loss_forward(const T* probs, const int* expert_idx, int N, int E, int K);
// dprobs[N, E] += dloss * d(aux)/d(probs).
template <typename T>
void router_aux_loss_backward(T* dprobs, T dloss, const int* expert_idx, int N, int E, int K);
}  // namespace ref

namespace cpu {
void router_forward(int* expert_idx, float* expert_weight, float* probs, const float* logits, int N,
                    int E, int K, bool normalize_topk, Arena& scratch);
void router_backward(float* dlogits, const float* dexpert_weight, const float* dprobs,
                     const float* probs, const int* expert_idx, const float* expert_weight, int N,
                     int E, int K, bool normalize_topk, Arena& scratch);
float router_aux_loss_forward(const float* probs, const int* expert_idx, int N, int E, int K,
                              Arena& scratch);
void router_aux_loss_backward(float* dprobs, float dloss, const int* expert_idx, int N, int E,
                              int K, Arena& scratch);
}  // namespace cpu
}  // namespace rlf
