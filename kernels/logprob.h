// Log-softmax, cross-entropy and per-token log-prob gather over logits [N, V].
// The loss functions of the model and of RL (NLL, PPO ratio, KL) are built from logprob_forward:
// cross-entropy of token n is -logp[n].
#pragma once

namespace rlf {
class Arena;

namespace ref {
// out[N, V] = logits - logsumexp(logits) per row.
template <typename T>
void log_softmax_forward(T* out, const T* logits, int N, int V);
// logp[N] = log softmax(logits[n])[targets[n]]; lse[N] saves the row's log-sum-exp.
template <typename T>
void logprob_forward(T* logp, T* lse, const T* logits, const int* targets, int N, int V);
// dlogits[n, v] += dlogp[n] * (1[v == targets[n]] - softmax(logits[n])[v]).
template <typename T>
void logprob_backward(T* dlogits, const T* dlogp, const T* logits, const T* lse, const int* targets,
                      int N, int V);
}  // namespace ref

namespace cpu {
void log_softmax_forward(float* out, const float* logits, int N, int V, Arena& scratch);
void logprob_forward(float* logp, float* lse, const float* logits, const int* targets, int N, int V,
                     Arena& scratch);
void logprob_backward(float* dlogits, const float* dlogp, const float* logits, const float* lse,
                      const int* targets, int N, int V, Arena& scratch);
}  // namespace cpu
}  // namespace rlf
