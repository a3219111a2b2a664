// A learned reward model (verifier): the same MoE transformer body as the policy with a scalar
// head on the last token's final hidden state (src/model/reward_head.h). Its LM head is part of
// the body's layout but unused (it gets no gradient). Everything lives in one arena: the policy's
// device arena (fused-all) or a host arena of its own.
#pragma once

#include <cstdint>
#include <vector>

#include "src/model/reward_head.h"
#include "src/model/transformer.h"

namespace rlf {

template <typename T>
class RewardModel {
 public:
  RewardModel(const ModelConfig& config, const Ops<T>& ops, Arena& memory, bool with_gradients);

  Transformer<T>& body() { return body_; }
  RewardHead<T>& head() { return head_; }
  const ModelConfig& config() const { return body_.config(); }
  Arena& memory() const { return body_.device(); }
  int64_t parameter_count() const { return body_.parameter_count() + head_.parameter_count(); }

  void initialize(uint64_t seed);
  void zero_gradients();

  // Forward over S packed sequences (tokens[N], N = seq_offsets[S]): one logit per sequence.
  // Training keeps the body's activations for backward(); otherwise they are released.
  std::vector<T> logits(const int* tokens, const int* seq_offsets, int S, bool training);
  // After a training logits(): adds the gradient of sum(dlogits . logits) + aux_weight *
  // body().aux_loss() into the body's and the head's gradients.
  void backward(const T* dlogits, T aux_weight);

  // sigmoid(logit) of each sequence, `batch` sequences per forward.
  std::vector<double> scores(const std::vector<std::vector<int>>& sequences, int batch);

 private:
  Transformer<T> body_;
  RewardHead<T> head_;
  std::vector<int> trained_offsets_;  // layout of the last training forward
};

// Bytes a reward model's parameters (body + head) take in an arena, what a memory plan counts.
size_t reward_model_parameter_bytes(const ModelConfig& config);

}  // namespace rlf
