// Mixture-of-experts token routing and the grouped expert SwiGLU FFN.
//
// Canonical order: the M = N * K token-expert assignments are grouped by expert, and inside an
// expert by (token, slot). Every path (single rank, flat or hierarchical EP dispatch) puts rows in
// this order before the expert GEMMs and combines in slot order k = 0..K-1, so all paths agree
// bit for bit.
//
// Expert weights are addressed per expert: w1[e] and w3[e] point at expert e's [F, C] gate and up
// projections, w2[e] at its [C, F] down projection (e = 0..E-1 of the call), each contiguous.
// Where an expert lives is the caller's: consecutive rows of [E, F, C] / [E, C, F] tensors (a flat
// parameter buffer: consecutive_experts), or a fixed-size bucket w1 | w3 | w2 anywhere in memory
// (parameter buckets, src/model/expert_table.h). Weight gradients are addressed the same way; a
// null array skips that gradient.
//   a = xg @ w1_e^T, b = xg @ w3_e^T, h = silu(a) * b, y = h @ w2_e^T.
// A dense SwiGLU FFN (the shared expert) is the same call with E = 1 and offsets {0, N}.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace rlf {
class Arena;

// Pointers to `count` consecutive experts of `expert_size` elements each, from `first` (the
// experts of one [E, F, C] or [E, C, F] tensor).
template <typename T>
std::vector<T*> consecutive_experts(T* first, int count, int64_t expert_size) {
  std::vector<T*> experts(std::size_t(count > 0 ? count : 0));
  for (int e = 0; e < count; ++e) experts[std::size_t(e)] = first + e * expert_size;
  return experts;
}

// Index work shared by every backend (no floating point, so no ref/fast split):
//   expert_offsets[E+1]: rows of expert e are [expert_offsets[e], expert_offsets[e+1]);
//   row_of_assignment[N*K]: grouped row of assignment (n, k) at index n*K + k;
//   token_of_row[M]: token n of each grouped row.
void moe_build_routing(int* expert_offsets, int* row_of_assignment, int* token_of_row,
                       const int* expert_idx, int N, int E, int K);

namespace ref {
// xg[M, C] = x[token_of_row[m], :].
template <typename T>
void moe_gather(T* xg, const T* x, const int* token_of_row, int M, int C);
// dx[n] += sum over k = 0..K-1 of dxg[row_of_assignment[n*K + k]].
template <typename T>
void moe_gather_backward(T* dx, const T* dxg, const int* row_of_assignment, int N, int K, int C);
// out[n] = sum over k = 0..K-1 of expert_weight[n, k] * y[row_of_assignment[n*K + k]].
template <typename T>
void moe_combine(T* out, const T* y, const T* expert_weight, const int* row_of_assignment, int N,
                 int K, int C);
// dy[row] += w[n, k] * dout[n]; dexpert_weight[n, k] += dot(dout[n], y[row]).
template <typename T>
void moe_combine_backward(T* dy, T* dexpert_weight, const T* dout, const T* y,
                          const T* expert_weight, const int* row_of_assignment, int N, int K,
                          int C);
// Grouped SwiGLU: writes y[M, C] and saves the pre-activations a[M, F], b[M, F].
template <typename T>
void expert_ffn_forward(T* y, T* a, T* b, const T* xg, const T* const* w1, const T* const* w3,
                        const T* const* w2, const int* expert_offsets, int E, int C, int F);
template <typename T>
void expert_ffn_backward(T* dxg, T* const* dw1, T* const* dw3, T* const* dw2, const T* dy,
                         const T* xg, const T* a, const T* b, const T* const* w1,
                         const T* const* w3, const T* const* w2, const int* expert_offsets, int E,
                         int C, int F);
}  // namespace ref

namespace cpu {
void moe_gather(float* xg, const float* x, const int* token_of_row, int M, int C, Arena& scratch);
void moe_gather_backward(float* dx, const float* dxg, const int* row_of_assignment, int N, int K,
                         int C, Arena& scratch);
void moe_combine(float* out, const float* y, const float* expert_weight,
                 const int* row_of_assignment, int N, int K, int C, Arena& scratch);
void moe_combine_backward(float* dy, float* dexpert_weight, const float* dout, const float* y,
                          const float* expert_weight, const int* row_of_assignment, int N, int K,
                          int C, Arena& scratch);
void expert_ffn_forward(float* y, float* a, float* b, const float* xg, const float* const* w1,
                        const float* const* w3, const float* const* w2, const int* expert_offsets,
                        int E, int C, int F, Arena& scratch);
void expert_ffn_backward(float* dxg, float* const* dw1, float* const* dw3, float* const* dw2,
                         const float* dy, const float* xg, const float* a, const float* b,
                         const float* const* w1, const float* const* w3, const float* const* w2,
                         const int* expert_offsets, int E, int C, int F, Arena& scratch);
}  // namespace cpu
}  // namespace rlf
