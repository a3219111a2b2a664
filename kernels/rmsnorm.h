// RMSNorm: out = inp / sqrt(mean(inp^2) + eps) * weight, per token row of width C.
#pragma once

namespace rlf {
class Arena;

namespace ref {
// rstd[N] saves 1/sqrt(mean(inp^2) + eps) for the backward pass.
template <typename T>
void rmsnorm_forward(T* out, T* rstd, const T* inp, const T* weight, int N, int C, T eps);
template <typename T>
void rmsnorm_backward(T* dinp, T* dweight, const T* dout, const T* inp, const T* weight,
                      const T* rstd, int N, int C);
}  // namespace ref
namespace cpu {
void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int N, int C,
                     float eps, Arena& scratch);
void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                      const float* weight, const float* rstd, int N, int C, Arena& scratch);
}  // namespace cpu
}  // namespace rlf
