// AdamW with decoupled weight decay and global-norm gradient clipping.
#pragma once

#include <cstdint>

namespace rlf {
class Arena;

struct AdamWHyper {
  float learning_rate = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
};

// Scale applied to gradients so that their global norm is at most max_norm (1 if already under,
// or if max_norm <= 0 which disables clipping).
inline float clip_scale(double global_norm, float max_norm) {
  if (max_norm <= 0.0f || global_norm <= double(max_norm)) return 1.0f;
  return float(double(max_norm) / (global_norm + 1e-6));
}

namespace ref {
// Sum of squares accumulated in double, in index order.
template <typename T>
double grad_norm_squared(const T* grad, int64_t n);
// step counts from 1. g = grad * grad_scale;
//   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;  mhat = m/(1-b1^step);  vhat = v/(1-b2^step);
//   param -= lr * (mhat / (sqrt(vhat) + eps) + weight_decay * param).
template <typename T>
void adamw_update(T* param, const T* grad, T* m, T* v, int64_t n, const AdamWHyper& hyper, int step,
                  float grad_scale);
}  // namespace ref

namespace cpu {
// Fixed blocks of double partial sums, added in block order: independent of thread count.
double grad_norm_squared(const float* grad, int64_t n, Arena& scratch);
void adamw_update(float* param, const float* grad, float* m, float* v, int64_t n,
                  const AdamWHyper& hyper, int step, float grad_scale, Arena& scratch);
}  // namespace cpu
}  // namespace rlf
