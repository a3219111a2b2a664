// Token embedding lookup: out[N, C] = table[tokens[n], :].
#pragma once

namespace rlf {
class Arena;

namespace ref {
template <typename T>
void embedding_forward(T* out, const int* tokens, const T* table, int N, int C, int V);
// dtable[V, C] += scatter of dout by token. Accumulates in token order n = 0..N-1 for each row.
template <typename T>
void embedding_backward(T* dtable, const T* dout, const int* tokens, int N, int C, int V);
}  // namespace ref
namespace cpu {
void embedding_forward(float* out, const int* tokens, const float* table, int N, int C, int V,
                       Arena& scratch);
void embedding_backward(float* dtable, const float* dout, const int* tokens, int N, int C, int V,
                        Arena& scratch);
}  // namespace cpu
}  // namespace rlf
