#include "src/model/optimizer.h"

#include <cmath>
#include <cstring>

#include "kernels/arena.h"

namespace rlf {

template <typename T>
AdamW<T>::AdamW(Transformer<T>& model, const AdamWHyper& hyper, float max_grad_norm)
    : model_(model), hyper_(hyper), max_grad_norm_(max_grad_norm) {
  const size_t n = size_t(model.parameter_count());
  m_ = model.device().template allocate<T>(n, "optimizer first moment");
  v_ = model.device().template allocate<T>(n, "optimizer second moment");
  std::memset(static_cast<void*>(m_), 0, n * sizeof(T));
  std::memset(static_cast<void*>(v_), 0, n * sizeof(T));
}

template <typename T>
double AdamW<T>::step() {
  const auto& ops = model_.ops();
  const int64_t n = model_.parameter_count();
  const double norm = std::sqrt(ops.grad_norm_squared(model_.gradients(), n, model_.device()));
  ++step_;
  ops.adamw_update(model_.parameters(), model_.gradients(), m_, v_, n, hyper_, step_,
                   clip_scale(norm, max_grad_norm_), model_.device());
  return norm;
}

template class AdamW<float>;
template class AdamW<double>;

}  // namespace rlf
