#include "src/model/reward_head.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/arena.h"
#include "kernels/rng.h"

namespace rlf {

template <typename T>
RewardHead<T>::RewardHead(int d_model, Arena& memory, bool with_gradients) : d_model_(d_model) {
  const size_t n = size_t(parameter_count());
  params_ = memory.allocate_zeroed<T>(n, "reward head parameters");
  if (with_gradients) {
    grads_ = memory.allocate_zeroed<T>(n, "reward head gradients");
    m_ = memory.allocate_zeroed<T>(n, "reward head optimizer moments");
    v_ = memory.allocate_zeroed<T>(n, "reward head optimizer moments");
  }
}

template <typename T>
void RewardHead<T>::initialize(uint64_t seed, float std) {
  // Stream 0 is the body's first tensor's; the head draws from a stream no tensor uses.
  constexpr uint64_t kHeadStream = uint64_t(1) << 62;
  for (int i = 0; i < d_model_; ++i) {
    params_[i] = T(std * philox_normal(seed, kHeadStream, uint64_t(i)));
  }
  params_[d_model_] = T(0);
}

template <typename T>
void RewardHead<T>::zero_gradients() {
  std::memset(static_cast<void*>(grads_), 0, size_t(parameter_count()) * sizeof(T));
}

template <typename T>
void RewardHead<T>::forward(const T* hidden, const int* seq_offsets, int S, T* logits) const {
  for (int s = 0; s < S; ++s) {
    const T* h = hidden + int64_t(seq_offsets[s + 1] - 1) * d_model_;
    T sum = params_[d_model_];
    for (int c = 0; c < d_model_; ++c) sum += params_[c] * h[c];
    logits[s] = sum;
  }
}

template <typename T>
void RewardHead<T>::backward(const T* hidden, const int* seq_offsets, int S, const T* dlogits,
                             T* dhidden) {
  for (int s = 0; s < S; ++s) {
    const int64_t row = int64_t(seq_offsets[s + 1] - 1) * d_model_;
    for (int c = 0; c < d_model_; ++c) {
      grads_[c] += dlogits[s] * hidden[row + c];
      dhidden[row + c] += dlogits[s] * params_[c];
    }
    grads_[d_model_] += dlogits[s];
  }
}

template <typename T>
T sigmoid(T x) {
  if (x >= T(0)) return T(1) / (T(1) + std::exp(-x));
  const T e = std::exp(x);
  return e / (T(1) + e);
}

template <typename T>
T binary_cross_entropy(const T* logits, const T* labels, int S, T* dlogits) {
  T loss = 0;
  for (int s = 0; s < S; ++s) {
    // -[y log p + (1 - y) log(1 - p)] = max(x, 0) - x y + log(1 + exp(-|x|)).
    const T x = logits[s], y = labels[s];
    loss += std::max(x, T(0)) - x * y + std::log1p(std::exp(-std::abs(x)));
    if (dlogits) dlogits[s] = (sigmoid(x) - y) / T(S);
  }
  return loss / T(S);
}

template class RewardHead<float>;
template class RewardHead<double>;
template float binary_cross_entropy(const float*, const float*, int, float*);
template double binary_cross_entropy(const double*, const double*, int, double*);
template float sigmoid(float);
template double sigmoid(double);

}  // namespace rlf
