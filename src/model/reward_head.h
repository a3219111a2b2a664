// The scalar head of a learned reward model (verifier): one logit per sequence from the final
// hidden state of its last token, logit = w . h + b, score = sigmoid(logit) = the estimated
// probability that the response is correct. Trained with binary cross-entropy. Its d_model + 1
// parameters live next to the body's (the same MoE transformer) in their own buffer.
#pragma once

#include <cstdint>

namespace rlf {

class Arena;

template <typename T>
class RewardHead {
 public:
  // Parameters, gradients (when with_gradients) and AdamW moments come from `memory`.
  RewardHead(int d_model, Arena& memory, bool with_gradients);

  int d_model() const { return d_model_; }
  int64_t parameter_count() const { return int64_t(d_model_) + 1; }
  T* parameters() const { return params_; }  // weight [d_model], then the bias
  T* gradients() const { return grads_; }
  T* first_moment() const { return m_; }
  T* second_moment() const { return v_; }

  // Seeded N(0, std^2) weight, zero bias.
  void initialize(uint64_t seed, float std);
  void zero_gradients();

  // logits[s] = w . hidden[seq_offsets[s + 1] - 1] + b for S packed sequences (hidden [N, C]).
  void forward(const T* hidden, const int* seq_offsets, int S, T* logits) const;
  // Adds the gradient of sum(dlogits . logits) into gradients() and into dhidden [N, C] (only the
  // last row of each sequence is touched).
  void backward(const T* hidden, const int* seq_offsets, int S, const T* dlogits, T* dhidden);

 private:
  int d_model_;
  T* params_ = nullptr;
  T* grads_ = nullptr;
  T* m_ = nullptr;
  T* v_ = nullptr;
};

// Mean binary cross-entropy of sigmoid(logits[s]) against labels[s] in {0, 1}, computed stably
// from the logits; dlogits (if not null) gets its gradient, (sigmoid(logit) - label) / S.
template <typename T>
T binary_cross_entropy(const T* logits, const T* labels, int S, T* dlogits);

// sigmoid(x) without overflow for large |x|.
template <typename T>
T sigmoid(T x);

}  // namespace rlf
