// Causal multi-head attention over packed variable-length sequences, and single-token decode
// against a KV cache. q, k, v, out are [N, H, D]; sequence s owns tokens
// [seq_offsets[s], seq_offsets[s+1]) and each token attends to itself and earlier tokens of its
// own sequence only. Scale is 1/sqrt(D).
#pragma once

namespace rlf {
class Arena;

namespace ref {
// lse[N, H] saves the log-sum-exp of each query's scaled scores for the backward pass.
template <typename T>
void attention_forward(T* out, T* lse, const T* q, const T* k, const T* v, const int* seq_offsets,
                       int S, int H, int D);
// Recomputes probabilities from q, k and lse; adds into dq, dk, dv.
template <typename T>
void attention_backward(T* dq, T* dk, T* dv, const T* dout, const T* out, const T* lse, const T* q,
                        const T* k, const T* v, const int* seq_offsets, int S, int H, int D);
// One new query per batch row b: q[B, H, D]. Row b reads cache slot cache_slots[b] of
// k_cache/v_cache [slots, max_len, H, D] at positions [0, cache_lens[b]) (the new token's k and v
// are already written at position cache_lens[b] - 1). out[B, H, D].
template <typename T>
void attention_decode(T* out, const T* q, const T* k_cache, const T* v_cache,
                      const int* cache_slots, const int* cache_lens, int B, int H, int D,
                      int max_len);
}  // namespace ref
namespace cpu {
void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                       const int* seq_offsets, int S, int H, int D, Arena& scratch);
void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* out,
                        const float* lse, const float* q, const float* k, const float* v,
                        const int* seq_offsets, int S, int H, int D, Arena& scratch);
void attention_decode(float* out, const float* q, const float* k_cache, const float* v_cache,
                      const int* cache_slots, const int* cache_lens, int B, int H, int D,
                      int max_len, Arena& scratch);
}  // namespace cpu
}  // namespace rlf
