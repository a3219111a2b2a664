// The smallest MoE policy the RL tests train: every task's tokenizer, two layers, four experts.
#pragma once

#include "src/model/model_config.h"
#include "src/rl/tokenizer.h"

namespace rlf::test {

inline ModelConfig tiny_policy_config() {
  ModelConfig c;
  c.name = "tiny-policy";
  c.vocab_size = Tokenizer::vocab_size();
  c.d_model = 16;
  c.n_layers = 2;
  c.n_heads = 2;
  c.n_experts = 4;
  c.top_k = 2;
  c.d_ff = 16;
  c.shared_expert_d_ff = 8;
  c.max_seq_len = 32;
  c.init_std = 0.2f;
  c.validate("test");
  return c;
}

// The tiny policy without the router load-balancing loss: that loss is a function of each
// micro-batch's routing statistics, so it is not additive across shards, and the data- and
// expert-parallel tests compare sharded training with one rank on the policy-gradient loss.
inline ModelConfig tiny_policy_config_without_aux_loss() {
  ModelConfig c = tiny_policy_config();
  c.aux_loss_coef = 0.0f;
  return c;
}

}  // namespace rlf::test
