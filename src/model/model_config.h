// Shape of a decoder-only MoE transformer, read from an INI file in inputs/models/.
#pragma once

#include <cstdint>
#include <string>

namespace rlf {

struct ModelConfig {
  std::string name = "unnamed";
  int vocab_size = 0;
  int d_model = 0;
  int n_layers = 0;
  int n_heads = 0;
  int n_experts = 0;
  int top_k = 0;
  int d_ff = 0;                // hidden width of each routed expert
  int shared_expert_d_ff = 0;  // 0: no shared expert
  int max_seq_len = 0;
  float rope_theta = 10000.0f;
  float norm_eps = 1e-5f;
  float init_std = 0.02f;
  bool normalize_topk = true;
  float aux_loss_coef = 0.01f;
  // Injected router skew (src/model/router_skew.h; not read from model files: `train
  // --router-skew`): 0 is the plain model.
  float router_skew = 0.0f;

  int head_dim() const { return d_model / n_heads; }
  int64_t parameter_count() const;
  // Parameters one token touches in a forward pass (attention + top_k experts + shared).
  int64_t active_parameter_count() const;
  // Throws ConfigError naming the first field that does not fit.
  void validate(const std::string& source) const;
};

// Reads `[model]` keys from an INI file; unknown keys and malformed values are ConfigErrors that
// name the file. `name_or_path`: a path, or a bare name resolved to inputs/models/<name>.ini.
ModelConfig load_model_config(const std::string& name_or_path);
std::string resolve_model_path(const std::string& name_or_path);

}  // namespace rlf
