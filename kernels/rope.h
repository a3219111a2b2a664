// Rotary position embedding on [N, H, D] (D even), rotating pairs (2i, 2i+1) of each head by
// angle positions[n] * theta^(-2i/D). Positions are per token so packed sequences and decode
// batches at different lengths work. `out` may equal `inp` (in place).
#pragma once

namespace rlf {
class Arena;

namespace ref {
template <typename T>
void rope_forward(T* out, const T* inp, const int* positions, int N, int H, int D, float theta);
// dinp += rotation of dout by the negative angle (the transpose of the forward rotation).
template <typename T>
void rope_backward(T* dinp, const T* dout, const int* positions, int N, int H, int D, float theta);
}  // namespace ref
namespace cpu {
void rope_forward(float* out, const float* inp, const int* positions, int N, int H, int D,
                  float theta, Arena& scratch);
void rope_backward(float* dinp, const float* dout, const int* positions, int N, int H, int D,
                   float theta, Arena& scratch);
}  // namespace cpu
}  // namespace rlf
