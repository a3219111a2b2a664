// Reference AdamW and global gradient norm: plain loops in index order.
#include "kernels/adamw.h"

#include <cmath>
#include <cstdint>

namespace rlf::ref {

template <typename T>
double grad_norm_squared(const T* grad, int64_t n) {
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += double(grad[i]) * double(grad[i]);
  return sum;
}

template <typename T>
void adamw_update(T* param, const T* grad, T* m, T* v, int64_t n, const AdamWHyper& hyper, int step,
                  float grad_scale) {
  const T b1 = T(hyper.beta1), b2 = T(hyper.beta2);
  const T lr = T(hyper.learning_rate), eps = T(hyper.eps), wd = T(hyper.weight_decay);
  const T scale = T(grad_scale);
  // Bias corrections 1 - beta^step (step counts from 1), computed in double.
  const T bc1 = T(1.0 - std::pow(double(hyper.beta1), double(step)));
  const T bc2 = T(1.0 - std::pow(double(hyper.beta2), double(step)));
  const T one_minus_b1 = T(1) - b1, one_minus_b2 = T(1) - b2;
  for (int64_t i = 0; i < n; ++i) {
    const T g = grad[i] * scale;
    m[i] = b1 * m[i] + one_minus_b1 * g;
    v[i] = b2 * v[i] + one_minus_b2 * (g * g);
    const T mhat = m[i] / bc1;
    const T vhat = v[i] / bc2;
    param[i] -= lr * (mhat / (std::sqrt(vhat) + eps) + wd * param[i]);
  }
}

template double grad_norm_squared<float>(const float*, int64_t);
template double grad_norm_squared<double>(const double*, int64_t);
template void adamw_update<float>(float*, const float*, float*, float*, int64_t, const AdamWHyper&,
                                  int, float);
template void adamw_update<double>(double*, const double*, double*, double*, int64_t,
                                   const AdamWHyper&, int, float);

}  // namespace rlf::ref
