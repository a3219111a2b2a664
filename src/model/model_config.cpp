#include "src/model/model_config.h"

#include <boost/program_options.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <vector>

#include "kernels/error.h"
#include "src/io/input_files.h"

namespace po = boost::program_options;

namespace rlf {

int64_t ModelConfig::parameter_count() const {
  const int64_t C = d_model, V = vocab_size, E = n_experts, F = d_ff, S = shared_expert_d_ff;
  const int64_t per_layer = 2 * C        // two RMSNorm weights
                            + 4 * C * C  // wq, wk, wv, wo
                            + E * C      // router
                            + E * 3 * C * F + 3 * C * S;
  return 2 * V * C + C + n_layers * per_layer;  // embedding, lm head, final norm
}

int64_t ModelConfig::active_parameter_count() const {
  const int64_t C = d_model, V = vocab_size, F = d_ff, S = shared_expert_d_ff;
  const int64_t per_layer =
      2 * C + 4 * C * C + int64_t(n_experts) * C + top_k * 3 * C * F + 3 * C * S;
  return 2 * V * C + C + n_layers * per_layer;
}

void ModelConfig::validate(const std::string& source) const {
  auto fail = [&](const std::string& what) { throw ConfigError(source + ": model." + what); };
  auto positive = [&](int value, const char* key) {
    if (value <= 0)
      fail(std::string(key) + " must be a positive integer, got " + std::to_string(value));
  };
  positive(vocab_size, "vocab_size");
  positive(d_model, "d_model");
  positive(n_layers, "n_layers");
  positive(n_heads, "n_heads");
  positive(n_experts, "n_experts");
  positive(top_k, "top_k");
  positive(d_ff, "d_ff");
  positive(max_seq_len, "max_seq_len");
  if (d_model % n_heads != 0) {
    fail("n_heads = " + std::to_string(n_heads) +
         " must divide d_model = " + std::to_string(d_model));
  }
  if (head_dim() % 2 != 0) {
    fail("head dimension d_model / n_heads = " + std::to_string(head_dim()) +
         " must be even (RoPE rotates pairs)");
  }
  if (top_k > n_experts) {
    fail("top_k = " + std::to_string(top_k) +
         " must be at most n_experts = " + std::to_string(n_experts));
  }
  if (shared_expert_d_ff < 0) fail("shared_expert_d_ff must be >= 0 (0 disables it)");
  if (!(rope_theta > 0)) fail("rope_theta must be > 0");
  if (!(norm_eps > 0)) fail("norm_eps must be > 0");
  if (!(init_std > 0)) fail("init_std must be > 0");
  if (aux_loss_coef < 0) fail("aux_loss_coef must be >= 0");
}

std::string resolve_model_path(const std::string& name_or_path) {
  return resolve_input_file("models", name_or_path);
}

ModelConfig load_model_config(const std::string& name_or_path) {
  const std::string path = resolve_model_path(name_or_path);
  std::ifstream file(path);
  if (!file)
    throw ConfigError("model file '" + path +
                      "' cannot be read (give a path or a name in inputs/models/)");

  ModelConfig c;
  po::options_description desc("model");
  auto add = desc.add_options();
  add("model.name", po::value(&c.name));
  add("model.vocab_size", po::value(&c.vocab_size)->required());
  add("model.d_model", po::value(&c.d_model)->required());
  add("model.n_layers", po::value(&c.n_layers)->required());
  add("model.n_heads", po::value(&c.n_heads)->required());
  add("model.n_experts", po::value(&c.n_experts)->required());
  add("model.top_k", po::value(&c.top_k)->required());
  add("model.d_ff", po::value(&c.d_ff)->required());
  add("model.shared_expert_d_ff", po::value(&c.shared_expert_d_ff));
  add("model.max_seq_len", po::value(&c.max_seq_len)->required());
  add("model.rope_theta", po::value(&c.rope_theta));
  add("model.norm_eps", po::value(&c.norm_eps));
  add("model.init_std", po::value(&c.init_std));
  add("model.normalize_topk", po::value(&c.normalize_topk));
  add("model.aux_loss_coef", po::value(&c.aux_loss_coef));
  try {
    po::variables_map vm;
    po::store(po::parse_config_file(file, desc, /*allow_unregistered=*/false), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    throw ConfigError("model file '" + path + "': " + e.what());
  }
  if (c.name == "unnamed") c.name = std::filesystem::path(path).stem().string();
  c.validate("model file '" + path + "'");
  return c;
}

}  // namespace rlf
