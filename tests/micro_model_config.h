// The micro model of the whole-model tests: small enough for finite differences in double, with
// large weights so that routing and attention are far from uniform.
#pragma once

#include "src/model/model_config.h"

namespace rlf::test {

inline ModelConfig micro_config() {
  ModelConfig c;
  c.name = "micro";
  c.vocab_size = 11;
  c.d_model = 8;
  c.n_layers = 2;
  c.n_heads = 2;
  c.n_experts = 4;
  c.top_k = 2;
  c.d_ff = 8;
  c.shared_expert_d_ff = 4;
  c.max_seq_len = 32;
  c.init_std = 0.5f;
  c.aux_loss_coef = 0.1f;
  c.validate("test");
  return c;
}

// The micro model with `n_layers` layers, 6 heads and a shared expert of 12: TP 1, 2 and 3 fit.
inline ModelConfig tensor_parallel_micro_config(int n_layers) {
  ModelConfig config = micro_config();
  config.d_model = 12;
  config.n_heads = 6;
  config.shared_expert_d_ff = 12;
  config.n_layers = n_layers;
  config.validate("test");
  return config;
}

// tensor_parallel_micro_config with 6 experts: TP 1, 2 and 3 and EP 1, 2 and 3 fit.
inline ModelConfig tensor_expert_micro_config(int n_layers) {
  ModelConfig config = tensor_parallel_micro_config(n_layers);
  config.n_experts = 6;
  config.validate("test");
  return config;
}

}  // namespace rlf::test
