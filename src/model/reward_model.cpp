#include "src/model/reward_model.h"

#include <algorithm>
#include <stdexcept>

#include "kernels/arena.h"

namespace rlf {

template <typename T>
RewardModel<T>::RewardModel(const ModelConfig& config, const Ops<T>& ops, Arena& memory,
                            bool with_gradients)
    : body_(config, ops, memory, with_gradients), head_(config.d_model, memory, with_gradients) {}

template <typename T>
void RewardModel<T>::initialize(uint64_t seed) {
  body_.initialize(seed);
  head_.initialize(seed, config().init_std);
}

template <typename T>
void RewardModel<T>::zero_gradients() {
  body_.zero_gradients();
  head_.zero_gradients();
}

template <typename T>
std::vector<T> RewardModel<T>::logits(const int* tokens, const int* seq_offsets, int S,
                                      bool training) {
  body_.forward(tokens, seq_offsets, S);
  trained_offsets_.assign(seq_offsets, seq_offsets + S + 1);
  std::vector<T> out(static_cast<size_t>(S));
  head_.forward(body_.final_hidden(), seq_offsets, S, out.data());
  if (!training) body_.release_activations();
  return out;
}

template <typename T>
void RewardModel<T>::backward(const T* dlogits, T aux_weight) {
  const int S = int(trained_offsets_.size()) - 1, N = trained_offsets_.back();
  // Sits above the body's activations and is released with them.
  T* dhidden = body_.device().template allocate_zeroed<T>(size_t(N) * size_t(config().d_model),
                                                          "backward work");
  head_.backward(body_.final_hidden(), trained_offsets_.data(), S, dlogits, dhidden);
  body_.backward(nullptr, aux_weight, dhidden);
}

template <typename T>
std::vector<double> RewardModel<T>::scores(const std::vector<std::vector<int>>& sequences,
                                           int batch) {
  if (batch < 1) throw std::invalid_argument("RewardModel::scores: batch must be >= 1");
  std::vector<double> out;
  out.reserve(sequences.size());
  for (size_t first = 0; first < sequences.size(); first += size_t(batch)) {
    const size_t end = std::min(sequences.size(), first + size_t(batch));
    std::vector<int> tokens, offsets{0};
    for (size_t i = first; i < end; ++i) {
      tokens.insert(tokens.end(), sequences[i].begin(), sequences[i].end());
      offsets.push_back(int(tokens.size()));
    }
    const std::vector<T> l = logits(tokens.data(), offsets.data(), int(end - first), false);
    for (const T x : l) out.push_back(double(sigmoid(x)));
  }
  return out;
}

size_t reward_model_parameter_bytes(const ModelConfig& config) {
  auto arena_bytes = [](size_t floats) {
    const size_t a = Arena::kAlignment;
    return (floats * sizeof(float) + a - 1) / a * a;
  };
  return arena_bytes(size_t(ParameterLayout(config).total())) +
         arena_bytes(size_t(config.d_model) + 1);
}

template class RewardModel<float>;
template class RewardModel<double>;

}  // namespace rlf
