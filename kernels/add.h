// Element-wise sum out[i] = a[i] + b[i] over n values: the model's residual connections. `out`
// may equal `a` or `b` (in place). One add per element, so every backend gives the same bits.
#pragma once

#include <cstdint>

namespace rlf {
class Arena;

namespace ref {
template <typename T>
void add(T* out, const T* a, const T* b, int64_t n);
}  // namespace ref
namespace cpu {
void add(float* out, const float* a, const float* b, int64_t n, Arena& scratch);
}  // namespace cpu
}  // namespace rlf
