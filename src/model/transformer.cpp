#include "src/model/transformer.h"

#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include "kernels/arena.h"
#include "kernels/moe.h"

namespace rlf {

// Saved activations of one layer (pointers into the device arena).
template <typename T>
struct Transformer<T>::Layer {
  const T* x_in = nullptr;  // residual stream entering the layer
  T *xn1, *rstd1, *q, *k, *v, *att, *lse, *x_mid, *xn2, *rstd2;
  T *router_logits, *probs, *expert_weight, *xg, *ffn_a, *ffn_b, *y, *moe_out;
  T *shared_a = nullptr, *shared_b = nullptr, *shared_y = nullptr;
  int *expert_idx, *expert_offsets, *row_of_assignment, *token_of_row;
  int* shared_offsets = nullptr;
  T aux = T(0);
};

template <typename T>
struct Transformer<T>::AttentionMode {
  enum Kind { Packed, Decode } kind = Packed;
  const int* seq_offsets = nullptr;  // Packed: [S+1]
  int S = 0;
  KVCache<T>* cache = nullptr;       // Packed with a cache = prefill; Decode always has one
  const int* token_slots = nullptr;  // cache slot of every token (with a cache)
};

namespace {
template <typename T>
T* zeros(Arena& arena, int64_t n, const char* what) {
  T* p = arena.allocate<T>(size_t(n), what);
  std::memset(static_cast<void*>(p), 0, size_t(n) * sizeof(T));
  return p;
}
}  // namespace

template <typename T>
Transformer<T>::Transformer(const ModelConfig& config, const Ops<T>& ops, Arena& device,
                            bool with_gradients)
    : config_(config), layout_(config), ops_(ops), device_(device) {
  params_ = device_.allocate<T>(size_t(layout_.total()), "model parameters");
  if (with_gradients) grads_ = zeros<T>(device_, layout_.total(), "parameter gradients");
}

template <typename T>
Transformer<T>::~Transformer() = default;

template <typename T>
void Transformer<T>::initialize(uint64_t seed) {
  initialize_parameters(params_, layout_, config_, seed);
}

template <typename T>
void Transformer<T>::zero_gradients() {
  if (!grads_) throw std::logic_error("Transformer: model was built without gradients");
  std::memset(static_cast<void*>(grads_), 0, size_t(layout_.total()) * sizeof(T));
}

template <typename T>
typename Transformer<T>::Layer Transformer<T>::allocate_layer(int N) {
  const int64_t C = config_.d_model, E = config_.n_experts, K = config_.top_k;
  const int64_t F = config_.d_ff, M = int64_t(N) * K, H = config_.n_heads;
  Arena& d = device_;
  Layer a;
  a.xn1 = d.allocate<T>(N * C, "activations");
  a.rstd1 = d.allocate<T>(N, "activations");
  a.q = d.allocate<T>(N * C, "activations");
  a.k = d.allocate<T>(N * C, "activations");
  a.v = d.allocate<T>(N * C, "activations");
  a.att = d.allocate<T>(N * C, "activations");
  a.lse = d.allocate<T>(N * H, "activations");
  a.x_mid = d.allocate<T>(N * C, "activations");
  a.xn2 = d.allocate<T>(N * C, "activations");
  a.rstd2 = d.allocate<T>(N, "activations");
  a.router_logits = d.allocate<T>(N * E, "activations");
  a.probs = d.allocate<T>(N * E, "activations");
  a.expert_weight = d.allocate<T>(M, "activations");
  a.expert_idx = d.allocate<int>(M, "activations");
  a.expert_offsets = d.allocate<int>(E + 1, "activations");
  a.row_of_assignment = d.allocate<int>(M, "activations");
  a.token_of_row = d.allocate<int>(M, "activations");
  a.xg = d.allocate<T>(M * C, "activations");
  a.ffn_a = d.allocate<T>(M * F, "activations");
  a.ffn_b = d.allocate<T>(M * F, "activations");
  a.y = d.allocate<T>(M * C, "activations");
  a.moe_out = d.allocate<T>(N * C, "activations");
  if (config_.shared_expert_d_ff > 0) {
    const int64_t S = config_.shared_expert_d_ff;
    a.shared_a = d.allocate<T>(N * S, "activations");
    a.shared_b = d.allocate<T>(N * S, "activations");
    a.shared_y = d.allocate<T>(N * C, "activations");
    a.shared_offsets = d.allocate<int>(2, "activations");
    a.shared_offsets[0] = 0;
    a.shared_offsets[1] = N;
  }
  return a;
}

template <typename T>
void Transformer<T>::attention_core(int l, Layer& a, int N, const int* positions,
                                    const AttentionMode& mode) {
  const int H = config_.n_heads, D = config_.head_dim();
  const int64_t row = int64_t(H) * D;
  // Prefill and decode keep each token's key and value at its position in its sequence's slot.
  if (mode.cache) {
    KVCache<T>& cache = *mode.cache;
    for (int n = 0; n < N; ++n) {
      if (positions[n] >= cache.max_len) {
        throw std::out_of_range("KV cache: position " + std::to_string(positions[n]) +
                                " is beyond its max_len " + std::to_string(cache.max_len));
      }
      const int64_t at = (int64_t(mode.token_slots[n]) * cache.max_len + positions[n]) * row;
      std::memcpy(cache.keys[l] + at, a.k + n * row, size_t(row) * sizeof(T));
      std::memcpy(cache.values[l] + at, a.v + n * row, size_t(row) * sizeof(T));
    }
  }
  if (mode.kind == AttentionMode::Packed) {
    ops_.attention_forward(a.att, a.lse, a.q, a.k, a.v, mode.seq_offsets, mode.S, H, D, device_);
    return;
  }
  ArenaScope scope(device_);
  int* lens = device_.allocate<int>(size_t(N), "decode lengths");
  for (int n = 0; n < N; ++n) lens[n] = positions[n] + 1;
  ops_.attention_decode(a.att, a.q, mode.cache->keys[l], mode.cache->values[l], mode.token_slots,
                        lens, N, H, D, mode.cache->max_len, device_);
}

template <typename T>
void Transformer<T>::moe_forward(int l, Layer& a, int N) {
  const LayerOffsets& o = layout_.layer(l);
  const int C = config_.d_model, E = config_.n_experts, K = config_.top_k, F = config_.d_ff;
  const int M = N * K;
  ops_.matmul_forward(a.router_logits, a.xn2, params_ + o.router, N, C, E, device_);
  ops_.router_forward(a.expert_idx, a.expert_weight, a.probs, a.router_logits, N, E, K,
                      config_.normalize_topk, device_);
  a.aux = ops_.router_aux_loss_forward(a.probs, a.expert_idx, N, E, K, device_);
  moe_build_routing(a.expert_offsets, a.row_of_assignment, a.token_of_row, a.expert_idx, N, E, K);
  ops_.moe_gather(a.xg, a.xn2, a.token_of_row, M, C, device_);
  ops_.expert_ffn_forward(a.y, a.ffn_a, a.ffn_b, a.xg, params_ + o.w1, params_ + o.w3,
                          params_ + o.w2, a.expert_offsets, E, C, F, device_);
  ops_.moe_combine(a.moe_out, a.y, a.expert_weight, a.row_of_assignment, N, K, C, device_);
  if (a.shared_y) {
    ops_.expert_ffn_forward(a.shared_y, a.shared_a, a.shared_b, a.xn2, params_ + o.shared_w1,
                            params_ + o.shared_w3, params_ + o.shared_w2, a.shared_offsets, 1, C,
                            config_.shared_expert_d_ff, device_);
    for (int64_t i = 0; i < int64_t(N) * C; ++i) a.moe_out[i] += a.shared_y[i];
  }
}

template <typename T>
void Transformer<T>::layer_forward(int l, Layer& a, const T* x_in, T* x_out, int N,
                                   const int* positions, const AttentionMode& mode) {
  const LayerOffsets& o = layout_.layer(l);
  const int C = config_.d_model, H = config_.n_heads, D = config_.head_dim();
  const int64_t NC = int64_t(N) * C;
  a.x_in = x_in;
  ops_.rmsnorm_forward(a.xn1, a.rstd1, x_in, params_ + o.attn_norm, N, C, T(config_.norm_eps),
                       device_);
  ops_.matmul_forward(a.q, a.xn1, params_ + o.wq, N, C, C, device_);
  ops_.matmul_forward(a.k, a.xn1, params_ + o.wk, N, C, C, device_);
  ops_.matmul_forward(a.v, a.xn1, params_ + o.wv, N, C, C, device_);
  ops_.rope_forward(a.q, a.q, positions, N, H, D, config_.rope_theta, device_);
  ops_.rope_forward(a.k, a.k, positions, N, H, D, config_.rope_theta, device_);
  attention_core(l, a, N, positions, mode);
  ops_.matmul_forward(a.x_mid, a.att, params_ + o.wo, N, C, C, device_);
  for (int64_t i = 0; i < NC; ++i) a.x_mid[i] += x_in[i];
  ops_.rmsnorm_forward(a.xn2, a.rstd2, a.x_mid, params_ + o.ffn_norm, N, C, T(config_.norm_eps),
                       device_);
  moe_forward(l, a, N);
  for (int64_t i = 0; i < NC; ++i) x_out[i] = a.x_mid[i] + a.moe_out[i];
}

template <typename T>
const T* Transformer<T>::run(const int* tokens, int N, const int* positions,
                             const AttentionMode& mode, bool keep_activations) {
  const int C = config_.d_model, V = config_.vocab_size, L = config_.n_layers;
  const int64_t NC = int64_t(N) * C;
  T* x = device_.allocate<T>(size_t(NC), "residual stream");
  ops_.embedding_forward(x, tokens, params_ + layout_.embedding(), N, C, V, device_);
  aux_loss_ = T(0);
  if (keep_activations) {
    layers_.clear();
    for (int l = 0; l < L; ++l) {
      layers_.push_back(allocate_layer(N));
      T* x_out = device_.allocate<T>(size_t(NC), "residual stream");
      layer_forward(l, layers_.back(), x, x_out, N, positions, mode);
      aux_loss_ += layers_.back().aux;
      x = x_out;
    }
    return x;
  }
  // Inference keeps only two residual buffers; each layer's work memory is released after it.
  T* x_next = device_.allocate<T>(size_t(NC), "residual stream");
  for (int l = 0; l < L; ++l) {
    ArenaScope scope(device_);
    Layer a = allocate_layer(N);
    layer_forward(l, a, x, x_next, N, positions, mode);
    aux_loss_ += a.aux;
    std::swap(x, x_next);
  }
  return x;
}

template <typename T>
const T* Transformer<T>::head(const T* x, int N, bool keep_activations) {
  const int C = config_.d_model, V = config_.vocab_size;
  T* rstd = device_.allocate<T>(size_t(N), "activations");
  T* normed = device_.allocate<T>(size_t(N) * C, "activations");
  T* logits = device_.allocate<T>(size_t(N) * V, "logits");
  ops_.rmsnorm_forward(normed, rstd, x, params_ + layout_.final_norm(), N, C, T(config_.norm_eps),
                       device_);
  ops_.matmul_forward(logits, normed, params_ + layout_.lm_head(), N, C, V, device_);
  if (keep_activations) {
    final_in_ = x;
    final_out_ = normed;
    final_rstd_ = rstd;
  }
  return logits;
}

template <typename T>
const T* Transformer<T>::forward(const int* tokens, const int* seq_offsets, int S) {
  release_activations();
  activation_mark_ = device_.mark();
  has_activations_ = true;
  S_ = S;
  N_ = seq_offsets[S];
  int* offsets = device_.allocate<int>(size_t(S) + 1, "batch layout");
  std::memcpy(offsets, seq_offsets, (size_t(S) + 1) * sizeof(int));
  seq_offsets_ = offsets;
  tokens_ = device_.allocate<int>(size_t(N_), "batch tokens");
  std::memcpy(tokens_, tokens, size_t(N_) * sizeof(int));
  positions_ = device_.allocate<int>(size_t(N_), "batch positions");
  for (int s = 0; s < S; ++s) {
    for (int t = offsets[s]; t < offsets[s + 1]; ++t) positions_[t] = t - offsets[s];
  }
  AttentionMode mode;
  mode.seq_offsets = seq_offsets_;
  mode.S = S;
  const T* x = run(tokens_, N_, positions_, mode, /*keep_activations=*/true);
  logits_ = const_cast<T*>(head(x, N_, /*keep_activations=*/true));
  return logits_;
}

template <typename T>
void Transformer<T>::release_activations() {
  if (!has_activations_) return;
  device_.release(activation_mark_);
  layers_.clear();
  has_activations_ = false;
}

template <typename T>
void Transformer<T>::backward(const T* dlogits, T aux_weight) {
  if (!has_activations_) throw std::logic_error("Transformer::backward without forward");
  if (!grads_) throw std::logic_error("Transformer: model was built without gradients");
  const int C = config_.d_model, V = config_.vocab_size, N = N_;
  const int64_t NC = int64_t(N) * C;
  {
    T* dnormed = zeros<T>(device_, NC, "backward work");
    ops_.matmul_backward(dnormed, grads_ + layout_.lm_head(), dlogits, final_out_,
                         params_ + layout_.lm_head(), N, C, V, device_);
    T* dx = zeros<T>(device_, NC, "backward work");
    ops_.rmsnorm_backward(dx, grads_ + layout_.final_norm(), dnormed, final_in_,
                          params_ + layout_.final_norm(), final_rstd_, N, C, device_);
    for (int l = config_.n_layers - 1; l >= 0; --l) {
      layer_backward(l, layers_[size_t(l)], dx, N, positions_, aux_weight);
    }
    ops_.embedding_backward(grads_ + layout_.embedding(), dx, tokens_, N, C, V, device_);
  }
  release_activations();
}

template <typename T>
void Transformer<T>::moe_backward(int l, const Layer& a, const T* dout, T* dxn2, int N,
                                  T aux_weight) {
  const LayerOffsets& o = layout_.layer(l);
  const int C = config_.d_model, E = config_.n_experts, K = config_.top_k, F = config_.d_ff;
  const int64_t M = int64_t(N) * K;
  ArenaScope scope(device_);
  if (a.shared_y) {
    // moe_out = routed + shared: the shared expert sees dout directly.
    ops_.expert_ffn_backward(dxn2, grads_ + o.shared_w1, grads_ + o.shared_w3,
                             grads_ + o.shared_w2, dout, a.xn2, a.shared_a, a.shared_b,
                             params_ + o.shared_w1, params_ + o.shared_w3, params_ + o.shared_w2,
                             a.shared_offsets, 1, C, config_.shared_expert_d_ff, device_);
  }
  T* dy = zeros<T>(device_, M * C, "backward work");
  T* dweight = zeros<T>(device_, M, "backward work");
  ops_.moe_combine_backward(dy, dweight, dout, a.y, a.expert_weight, a.row_of_assignment, N, K, C,
                            device_);
  T* dxg = zeros<T>(device_, M * C, "backward work");
  ops_.expert_ffn_backward(dxg, grads_ + o.w1, grads_ + o.w3, grads_ + o.w2, dy, a.xg, a.ffn_a,
                           a.ffn_b, params_ + o.w1, params_ + o.w3, params_ + o.w2,
                           a.expert_offsets, E, C, F, device_);
  ops_.moe_gather_backward(dxn2, dxg, a.row_of_assignment, N, K, C, device_);
  T* dprobs = nullptr;
  if (aux_weight != T(0)) {
    dprobs = zeros<T>(device_, int64_t(N) * E, "backward work");
    ops_.router_aux_loss_backward(dprobs, aux_weight, a.expert_idx, N, E, K, device_);
  }
  T* drouter = zeros<T>(device_, int64_t(N) * E, "backward work");
  ops_.router_backward(drouter, dweight, dprobs, a.probs, a.expert_idx, a.expert_weight, N, E, K,
                       config_.normalize_topk, device_);
  ops_.matmul_backward(dxn2, grads_ + o.router, drouter, a.xn2, params_ + o.router, N, C, E,
                       device_);
}

template <typename T>
void Transformer<T>::layer_backward(int l, const Layer& a, T* dx, int N, const int* positions,
                                    T aux_weight) {
  const LayerOffsets& o = layout_.layer(l);
  const int C = config_.d_model, H = config_.n_heads, D = config_.head_dim();
  const int64_t NC = int64_t(N) * C;
  ArenaScope scope(device_);
  // x_out = x_mid + moe_out: both receive dx.
  T* dx_mid = device_.allocate<T>(size_t(NC), "backward work");
  std::memcpy(dx_mid, dx, size_t(NC) * sizeof(T));
  T* dxn2 = zeros<T>(device_, NC, "backward work");
  moe_backward(l, a, dx, dxn2, N, aux_weight);
  ops_.rmsnorm_backward(dx_mid, grads_ + o.ffn_norm, dxn2, a.x_mid, params_ + o.ffn_norm, a.rstd2,
                        N, C, device_);
  // x_mid = x_in + att @ wo^T.
  T* datt = zeros<T>(device_, NC, "backward work");
  ops_.matmul_backward(datt, grads_ + o.wo, dx_mid, a.att, params_ + o.wo, N, C, C, device_);
  T* dq = zeros<T>(device_, NC, "backward work");
  T* dk = zeros<T>(device_, NC, "backward work");
  T* dv = zeros<T>(device_, NC, "backward work");
  ops_.attention_backward(dq, dk, dv, datt, a.att, a.lse, a.q, a.k, a.v, seq_offsets_, S_, H, D,
                          device_);
  T* dq_pre = zeros<T>(device_, NC, "backward work");
  T* dk_pre = zeros<T>(device_, NC, "backward work");
  ops_.rope_backward(dq_pre, dq, positions, N, H, D, config_.rope_theta, device_);
  ops_.rope_backward(dk_pre, dk, positions, N, H, D, config_.rope_theta, device_);
  T* dxn1 = zeros<T>(device_, NC, "backward work");
  ops_.matmul_backward(dxn1, grads_ + o.wq, dq_pre, a.xn1, params_ + o.wq, N, C, C, device_);
  ops_.matmul_backward(dxn1, grads_ + o.wk, dk_pre, a.xn1, params_ + o.wk, N, C, C, device_);
  ops_.matmul_backward(dxn1, grads_ + o.wv, dv, a.xn1, params_ + o.wv, N, C, C, device_);
  // x_in feeds both the residual (dx_mid) and the attention norm.
  std::memcpy(dx, dx_mid, size_t(NC) * sizeof(T));
  ops_.rmsnorm_backward(dx, grads_ + o.attn_norm, dxn1, a.x_in, params_ + o.attn_norm, a.rstd1, N,
                        C, device_);
}

template <typename T>
KVCache<T> Transformer<T>::allocate_kv_cache(int slots, int max_len) {
  if (max_len > config_.max_seq_len) {
    throw std::invalid_argument("KV cache length " + std::to_string(max_len) +
                                " exceeds the model's max_seq_len " +
                                std::to_string(config_.max_seq_len));
  }
  KVCache<T> cache;
  cache.slots = slots;
  cache.max_len = max_len;
  const size_t per_layer = size_t(slots) * size_t(max_len) * size_t(config_.d_model);
  for (int l = 0; l < config_.n_layers; ++l) {
    cache.keys.push_back(device_.allocate<T>(per_layer, "KV cache"));
    cache.values.push_back(device_.allocate<T>(per_layer, "KV cache"));
  }
  return cache;
}

template <typename T>
const T* Transformer<T>::prefill(KVCache<T>& cache, const int* tokens, const int* seq_offsets,
                                 int S, const int* slots) {
  const int N = seq_offsets[S], C = config_.d_model;
  int* positions = device_.allocate<int>(size_t(N), "prefill layout");
  int* token_slots = device_.allocate<int>(size_t(N), "prefill layout");
  for (int s = 0; s < S; ++s) {
    for (int t = seq_offsets[s]; t < seq_offsets[s + 1]; ++t) {
      positions[t] = t - seq_offsets[s];
      token_slots[t] = slots[s];
    }
  }
  AttentionMode mode;
  mode.seq_offsets = seq_offsets;
  mode.S = S;
  mode.cache = &cache;
  mode.token_slots = token_slots;
  const T* x = run(tokens, N, positions, mode, /*keep_activations=*/false);
  T* last = device_.allocate<T>(size_t(S) * C, "prefill last tokens");
  for (int s = 0; s < S; ++s) {
    std::memcpy(last + int64_t(s) * C, x + int64_t(seq_offsets[s + 1] - 1) * C,
                size_t(C) * sizeof(T));
  }
  return head(last, S, /*keep_activations=*/false);
}

template <typename T>
const T* Transformer<T>::decode(KVCache<T>& cache, const int* tokens, const int* slots,
                                const int* positions, int B) {
  AttentionMode mode;
  mode.kind = AttentionMode::Decode;
  mode.cache = &cache;
  mode.token_slots = slots;
  const T* x = run(tokens, B, positions, mode, /*keep_activations=*/false);
  return head(x, B, /*keep_activations=*/false);
}

template class Transformer<float>;
template class Transformer<double>;

}  // namespace rlf
