// Dense matmul: out[N, OC] = inp[N, C] @ weight[OC, C]^T (no bias: the model has none).
#pragma once

#include <cstdint>

namespace rlf {
class Arena;

namespace ref {
template <typename T>
void matmul_forward(T* out, const T* inp, const T* weight, int N, int C, int OC);
// dinp[N, C] += dout @ weight; dweight[OC, C] += dout^T @ inp.
template <typename T>
void matmul_backward(T* dinp, T* dweight, const T* dout, const T* inp, const T* weight, int N,
                     int C, int OC);
}  // namespace ref
namespace cpu {
void matmul_forward(float* out, const float* inp, const float* weight, int N, int C, int OC,
                    Arena& scratch);
void matmul_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                     const float* weight, int N, int C, int OC, Arena& scratch);
}  // namespace cpu
}  // namespace rlf
