#include "src/model/transformer.h"

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>

#include "kernels/arena.h"
#include "kernels/gpu.h"
#include "mpi_comm/expert_dispatch.h"
#include "src/model/attention_pieces.h"
#include "src/model/tensor_parallel.h"

namespace rlf {

// Saved activations of one layer (pointers into the device arena).
template <typename T>
struct Transformer<T>::Layer {
  const T* x_in = nullptr;  // residual stream entering the layer
  T *xn1, *rstd1, *q, *k, *v, *att, *lse, *x_mid, *xn2, *rstd2, *moe_out;
  MoeActivations<T> moe;
};

template <typename T>
struct Transformer<T>::AttentionMode {
  enum Kind { Packed, Decode } kind = Packed;
  const int* seq_offsets = nullptr;  // Packed: [S+1]
  int S = 0;
  KVCache<T>* cache = nullptr;       // Packed with a cache = prefill; Decode always has one
  const int* token_slots = nullptr;  // cache slot of every token (with a cache)
};

template <typename T>
Transformer<T>::Transformer(const ModelConfig& config, const Ops<T>& ops, Arena& device,
                            bool with_gradients, ExpertShard experts, LayerShard layers,
                            const TensorParallel* tp)
    : config_(config),
      layout_(config, experts, std::move(layers), tp ? tp->slice() : TensorSlice{}),
      ops_(ops),
      device_(device),
      moe_(config_, ops, device),
      tp_(tp),
      router_counts_(std::make_shared<RouterCounts>(config)) {
  if (tp && tp->slice().splits_shared_expert())
    moe_.set_tensor_parallel(tp, layout_.shared_width());
  params_ = device_.allocate<T>(size_t(layout_.total()), "model parameters");
  experts_ = ExpertTable<T>(layout_, params_);
  if (with_gradients) allocate_gradients();
}

template <typename T>
Transformer<T>::Transformer(const Transformer& shared, Arena& activations)
    : config_(shared.config_),
      layout_(shared.layout_),
      ops_(shared.ops_),
      device_(activations),
      moe_(config_, ops_, activations),
      tp_(shared.tp_),
      params_(shared.params_),
      grads_(shared.grads_),
      experts_(shared.experts_),
      expert_grads_(shared.expert_grads_),
      view_(shared.view_),
      stitch_(shared.stitch_),
      router_counts_(shared.router_counts_) {
  if (tp_ && tp_->slice().splits_shared_expert())
    moe_.set_tensor_parallel(tp_, layout_.shared_width());
  moe_.set_token_split(shared.moe_.token_split());
  moe_.share_row_count(shared.moe_);
}

template <typename T>
Transformer<T>::Transformer(const Transformer& storage, ExpertTable<T> experts)
    : config_(storage.config_),
      layout_(storage.layout_),
      ops_(storage.ops_),
      device_(storage.device_),
      moe_(config_, ops_, device_),
      tp_(storage.tp_),
      params_(storage.params_),
      experts_(std::move(experts)),
      view_(true),
      stitch_(storage.stitch_),
      router_counts_(storage.router_counts_) {
  if (experts_.layers() != config_.n_layers || !experts_.complete() ||
      experts_.shard().first + experts_.shard().count > config_.n_experts) {
    throw std::invalid_argument(
        "Transformer: a view needs every expert of its shard on every layer");
  }
  if (tp_ && tp_->slice().splits_shared_expert())
    moe_.set_tensor_parallel(tp_, layout_.shared_width());
  moe_.set_token_split(storage.moe_.token_split());
  moe_.share_row_count(storage.moe_);
}

template <typename T>
Transformer<T>::Transformer(const Transformer& first, const Transformer& second)
    : config_(first.config_),
      layout_(first.config_, first.layout_.stored_expert_shard(), LayerShard{},
              first.layout_.tensor_slice()),
      ops_(first.ops_),
      device_(first.device_),
      moe_(config_, ops_, device_),
      tp_(first.tp_),
      // The rows of its routed-expert tensors: expert ids, or with redundant slots slot ids.
      experts_(first.config_.n_layers,
               ExpertShard{first.layout_.first_expert(), first.layout_.stored_experts()}),
      view_(true),
      router_counts_(std::make_shared<RouterCounts>(config_)) {
  const ParameterLayout& a = first.layout_;
  const ParameterLayout& b = second.layout_;
  const ExpertShard shard = experts_.shard();
  if (first.view_ || second.view_ || first.tp_ != second.tp_ ||
      a.redundant_slots() != b.redundant_slots() || b.first_expert() != shard.first ||
      b.stored_experts() != shard.count || a.own_experts().first != b.own_experts().first ||
      a.own_experts().count != b.own_experts().count ||
      first.config_.parameter_count() != second.config_.parameter_count() ||
      first.config_.n_layers != second.config_.n_layers) {
    throw std::invalid_argument(
        "Transformer: a stitched view needs two models of one config with the same experts (and "
        "the same redundant slots) and the same TP group (or none)");
  }
  // With TP both hold the group's slice: the view runs collectively over it (without the expert
  // token split unless the caller sets it, as for a whole model of the slice).
  if (tp_ && tp_->slice().splits_shared_expert())
    moe_.set_tensor_parallel(tp_, layout_.shared_width());
  // The model that stores a part: `first` when it does, else `second` when it does.
  const auto holder = [&](bool in_first, bool in_second) {
    return in_first ? &first : (in_second ? &second : nullptr);
  };
  auto stitch = std::make_shared<Stitch>();
  for (int l = 0; l < config_.n_layers; ++l) {
    const Transformer* source = holder(a.stores_layer(l), b.stores_layer(l));
    if (!source) {
      throw std::invalid_argument("Transformer: a stitched view needs layer " + std::to_string(l) +
                                  " in one of its models");
    }
    stitch->layer_base.push_back(source->params_);
    stitch->layer_offsets.push_back(source->layout_.layer(l));
    const ExpertTable<T>& held = source->experts_;
    for (int e = 0; e < shard.count; ++e) {
      experts_.set(l, shard.first + e, held.w1(l)[e], held.w3(l)[e], held.w2(l)[e]);
    }
  }
  const Transformer* embedding = holder(a.stores_embedding(), b.stores_embedding());
  const Transformer* head = holder(a.stores_head(), b.stores_head());
  if (!embedding || !head) {
    throw std::invalid_argument(
        "Transformer: a stitched view needs the embedding and the head in one of its models");
  }
  stitch->embedding = embedding->params_ + embedding->layout_.embedding();
  stitch->final_norm = head->params_ + head->layout_.final_norm();
  stitch->lm_head = head->params_ + head->layout_.lm_head();
  stitch_ = std::move(stitch);
}

template <typename T>
Transformer<T>::~Transformer() = default;

template <typename T>
T* Transformer<T>::layer_parameters(int l) const {
  return stitch_ ? stitch_->layer_base[size_t(l)] : params_;
}

template <typename T>
const LayerOffsets& Transformer<T>::layer_offsets(int l) const {
  return stitch_ ? stitch_->layer_offsets[size_t(l)] : layout_.layer(l);
}

template <typename T>
T* Transformer<T>::embedding_parameters() const {
  return stitch_ ? stitch_->embedding : params_ + layout_.embedding();
}

template <typename T>
T* Transformer<T>::final_norm_parameters() const {
  return stitch_ ? stitch_->final_norm : params_ + layout_.final_norm();
}

template <typename T>
T* Transformer<T>::lm_head_parameters() const {
  return stitch_ ? stitch_->lm_head : params_ + layout_.lm_head();
}

template <typename T>
void Transformer<T>::set_expert_token_split(bool split) {
  if (split && !tp_) {
    throw std::logic_error("Transformer: the expert token split needs tensor parallelism");
  }
  moe_.set_token_split(split ? tp_ : nullptr);
}

template <typename T>
void Transformer<T>::set_expert_parallel(std::vector<ExpertDispatcher*> per_layer) {
  if (!per_layer.empty() && int(per_layer.size()) != config_.n_layers) {
    throw std::invalid_argument("Transformer: expert parallelism needs one dispatcher per layer");
  }
  for (size_t l = 0; l < per_layer.size(); ++l) {
    bool shared = per_layer[l] == nullptr;
    for (size_t m = 0; m < l; ++m) shared = shared || per_layer[l] == per_layer[m];
    if (shared) throw std::invalid_argument("Transformer: every layer needs its own dispatcher");
    const ExpertDispatcher& d = *per_layer[l];
    const ExpertShard stored = experts_.shard();
    if ((stored.count != config_.n_experts || layout_.redundant_slots() > 0) &&
        (d.local_experts() != stored.count || d.ep_rank() * d.local_experts() != stored.first)) {
      throw std::invalid_argument(
          "Transformer: the dispatcher's local experts are not the experts this model stores");
    }
  }
  if (per_layer.empty()) overlap_.clear();
  expert_parallel_ = std::move(per_layer);
}

template <typename T>
void Transformer<T>::set_expert_overlap(std::vector<OverlappedExperts*> per_layer) {
  // (With the expert token split the overlapped chunks take this rank's share of the rows, as
  // the dispatchers do: MoeBlock::routed_forward_overlapped.)
  if (!per_layer.empty() && (int(per_layer.size()) != config_.n_layers || !expert_parallel())) {
    throw std::invalid_argument(
        "Transformer: overlap needs expert parallelism and one OverlappedExperts per layer");
  }
  overlap_ = std::move(per_layer);
}

template <typename T>
bool Transformer<T>::on_any_expert_parallel_rank(bool local) const {
  if (expert_parallel_.empty()) return local;
  int any = local ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &any, 1, MPI_INT, MPI_LOR, expert_parallel_.front()->comm());
  return any != 0;
}

template <typename T>
void Transformer<T>::tensor_parallel_sum(T* data, int64_t count) const {
  if (tp_) tp_->allreduce_sum(data, count);
}

template <typename T>
T* Transformer<T>::allocate_gradients(Zeroing zeroing) {
  if (view_) throw std::logic_error("Transformer: a view has no gradients");
  const size_t count = size_t(layout_.total());
  grads_ = device_.allocate<T>(count, "parameter gradients");
  if (zeroing == Zeroing::Streaming)
    device_.zero_streaming(grads_, count * sizeof(T));
  else
    device_.zero(grads_, count * sizeof(T));
  expert_grads_ = ExpertTable<T>(layout_, grads_);
  return grads_;
}

template <typename T>
void Transformer<T>::initialize(uint64_t seed) {
  if (view_) throw std::logic_error("Transformer: a view does not own its parameters");
  initialize_parameters(params_, layout_, config_, seed);
}

template <typename T>
void Transformer<T>::zero_gradients() {
  if (!grads_) throw std::logic_error("Transformer: model was built without gradients");
  device_.zero(grads_, size_t(layout_.total()) * sizeof(T));
}

template <typename T>
typename Transformer<T>::Layer Transformer<T>::allocate_layer(int N) {
  // With tensor parallelism Q, K, V and the attention output hold only this rank's heads.
  const int64_t C = config_.d_model, H = layout_.local_heads(), A = layout_.attention_width();
  Arena& d = device_;
  Layer a;
  a.xn1 = d.allocate<T>(N * C, "activations");
  a.rstd1 = d.allocate<T>(N, "activations");
  a.q = d.allocate<T>(N * A, "activations");
  a.k = d.allocate<T>(N * A, "activations");
  a.v = d.allocate<T>(N * A, "activations");
  a.att = d.allocate<T>(N * A, "activations");
  a.lse = d.allocate<T>(N * H, "activations");
  a.x_mid = d.allocate<T>(N * C, "activations");
  a.xn2 = d.allocate<T>(N * C, "activations");
  a.rstd2 = d.allocate<T>(N, "activations");
  a.moe_out = d.allocate<T>(N * C, "activations");
  a.moe = moe_.allocate(N, expert_parallel());
  return a;
}

template <typename T>
void Transformer<T>::store_in_cache(int l, const Layer& a, int N, const int* positions,
                                    const AttentionMode& mode) {
  const int64_t row = int64_t(layout_.local_heads()) * config_.head_dim();
  // Prefill and decode keep each token's key and value at its position in its sequence's slot.
  KVCache<T>& cache = *mode.cache;
  for (int n = 0; n < N; ++n) {
    if (positions[n] >= cache.max_len) {
      throw std::out_of_range("KV cache: position " + std::to_string(positions[n]) +
                              " is beyond its max_len " + std::to_string(cache.max_len));
    }
    std::memcpy(&cache.keys[l].at(mode.token_slots[n], positions[n], 0), a.k + n * row,
                size_t(row) * sizeof(T));
    std::memcpy(&cache.values[l].at(mode.token_slots[n], positions[n], 0), a.v + n * row,
                size_t(row) * sizeof(T));
  }
}

template <typename T>
void Transformer<T>::decode_attention(int l, Layer& a, int N, const int* positions,
                                      const AttentionMode& mode) {
  ArenaScope scope(device_);
  int* lens = device_.allocate<int>(size_t(N), "decode lengths");
  for (int n = 0; n < N; ++n) lens[n] = positions[n] + 1;
  ops_.attention_decode(a.att, a.q, mode.cache->keys[l].data, mode.cache->values[l].data,
                        mode.token_slots, lens, N, layout_.local_heads(), config_.head_dim(),
                        mode.cache->max_len, device_);
}

template <typename T>
std::vector<int64_t> Transformer<T>::take_local_expert_tokens(int l) {
  const int E = config_.n_experts;
  const auto first = router_counts_->expert_tokens.begin() + int64_t(l) * E;
  std::vector<int64_t> tokens(first, first + E);
  std::fill(first, first + E, 0);
  return tokens;
}

template <typename T>
typename Transformer<T>::TouchedExperts Transformer<T>::take_touched_experts() {
  return std::exchange(router_counts_->touched, TouchedExperts{});
}

template <typename T>
ResumablePass Transformer<T>::layer_forward(int l, Layer& a, const T* x_in, T* x_out, int N,
                                            const int* positions, const AttentionMode& mode) {
  // (A stitched view reads the layer where one of its two models stores it.)
  const LayerOffsets& o = layer_offsets(l);
  T* const w = layer_parameters(l);
  const int C = config_.d_model, D = config_.head_dim();
  const int H = layout_.local_heads(), A = layout_.attention_width();  // this TP rank's heads
  const int64_t NC = int64_t(N) * C;
  a.x_in = x_in;
  ops_.rmsnorm_forward(a.xn1, a.rstd1, x_in, w + o.attn_norm, N, C, T(config_.norm_eps), device_);
  ops_.matmul_forward(a.q, a.xn1, w + o.wq, N, C, A, device_);
  ops_.matmul_forward(a.k, a.xn1, w + o.wk, N, C, A, device_);
  ops_.matmul_forward(a.v, a.xn1, w + o.wv, N, C, A, device_);
  ops_.rope_forward(a.q, a.q, positions, N, H, D, config_.rope_theta, device_);
  ops_.rope_forward(a.k, a.k, positions, N, H, D, config_.rope_theta, device_);
  co_await progress_point();
  if (mode.cache) store_in_cache(l, a, N, positions, mode);
  if (mode.kind == AttentionMode::Packed) {
    // Packed sequences (training, log-probs, prefill): attention in pieces of whole sequences,
    // the bits of one call, a progress point after each.
    for (const SequenceRange& piece : attention_pieces(mode.S)) {
      ops_.attention_forward(a.att, a.lse, a.q, a.k, a.v, mode.seq_offsets + piece.first,
                             piece.count, H, D, device_);
      co_await progress_point();
    }
  } else {
    decode_attention(l, a, N, positions, mode);
    co_await progress_point();
  }
  ops_.matmul_forward(a.x_mid, a.att, w + o.wo, N, A, C, device_);
  tensor_parallel_sum(a.x_mid, NC);               // row-parallel wo: the heads' partial sums
  ops_.add(a.x_mid, a.x_mid, x_in, NC, device_);  // the residual connections: on the device
  ops_.rmsnorm_forward(a.xn2, a.rstd2, a.x_mid, w + o.ffn_norm, N, C, T(config_.norm_eps), device_);
  // Only a training forward (no cache) has a backward that pairs with the overlapped path.
  const bool training = mode.kind == AttentionMode::Packed && mode.cache == nullptr;
  co_await moe_.forward(moe_weights(o, w, experts_, l), a.xn2, a.moe_out, N, a.moe, dispatcher(l),
                        training ? overlap(l) : nullptr);
  if (training && !dispatcher(l)) {
    // The router statistics of a run without a dispatcher (which counts its own).
    const int E = config_.n_experts, K = config_.top_k;
    const RowShare own = moe_.own_rows(N);
    int64_t* counts = router_counts_->expert_tokens.data() + int64_t(l) * E;
    const int* chosen = a.moe.expert_idx + int64_t(own.first) * K;
    std::vector<bool> touched(size_t(E), false);
    for (int64_t i = 0; i < int64_t(own.count) * K; ++i) {
      ++counts[chosen[i]];
      touched[size_t(chosen[i])] = true;
    }
    router_counts_->touched.calls += 1;
    router_counts_->touched.touched += std::count(touched.begin(), touched.end(), true);
  }
  ops_.add(x_out, a.x_mid, a.moe_out, NC, device_);
}

template <typename T>
ResumablePass Transformer<T>::run(const int* tokens, const T* x_in, int N, const int* positions,
                                  const AttentionMode& mode, bool keep_activations, int first,
                                  int last, const T** result) {
  const int C = config_.d_model, V = config_.vocab_size;
  // A slot-space layout's rows are slots, not expert ids; a view addresses its experts by id
  // whatever the layout it reads them from.
  const bool slot_space = !view_ && layout_.redundant_slots() > 0;
  if ((experts_.shard().count != config_.n_experts || slot_space) && expert_parallel_.empty()) {
    throw std::logic_error(
        "Transformer: a model holding only some experts runs only with its "
        "expert-parallel dispatchers");
  }
  for (int l = first; l < last; ++l) {
    if (!layout_.stores_layer(l)) {
      throw std::logic_error("Transformer: layer " + std::to_string(l) +
                             " is not stored by this model (a pipeline stage's layer shard)");
    }
  }
  if ((!x_in && !layout_.stores_embedding()) ||
      (last == config_.n_layers && !layout_.stores_head())) {
    throw std::logic_error("Transformer: this model's layer shard has no embedding or no head");
  }
  const int64_t NC = int64_t(N) * C;
  T* x = device_.allocate<T>(size_t(NC), "residual stream");
  if (x_in) {
    std::memcpy(x, x_in, size_t(NC) * sizeof(T));
  } else {
    ops_.embedding_forward(x, tokens, embedding_parameters(), N, C, V, device_);
  }
  aux_loss_ = T(0);
  if (keep_activations) {
    layers_.clear();
    for (int l = first; l < last; ++l) {
      layers_.push_back(allocate_layer(N));
      T* x_out = device_.allocate<T>(size_t(NC), "residual stream");
      co_await layer_forward(l, layers_.back(), x, x_out, N, positions, mode);
      aux_loss_ += layers_.back().moe.aux;
      x = x_out;
    }
    *result = x;
    co_return;
  }
  // Inference keeps only two residual buffers; each layer's work memory is released after it.
  T* x_next = device_.allocate<T>(size_t(NC), "residual stream");
  for (int l = first; l < last; ++l) {
    ArenaScope scope(device_);
    Layer a = allocate_layer(N);
    co_await layer_forward(l, a, x, x_next, N, positions, mode);
    aux_loss_ += a.moe.aux;
    std::swap(x, x_next);
  }
  *result = x;
}

template <typename T>
const T* Transformer<T>::head(const T* x, int N, bool keep_activations) {
  const int C = config_.d_model, V = config_.vocab_size;
  T* rstd = device_.allocate<T>(size_t(N), "activations");
  T* normed = device_.allocate<T>(size_t(N) * C, "activations");
  T* logits = device_.allocate<T>(size_t(N) * V, "logits");
  ops_.rmsnorm_forward(normed, rstd, x, final_norm_parameters(), N, C, T(config_.norm_eps),
                       device_);
  ops_.matmul_forward(logits, normed, lm_head_parameters(), N, C, V, device_);
  if (keep_activations) {
    final_in_ = x;
    final_out_ = normed;
    final_rstd_ = rstd;
  }
  return logits;
}

template <typename T>
const T* Transformer<T>::forward(const int* tokens, const int* seq_offsets, int S) {
  return forward_range(tokens, seq_offsets, S, nullptr, 0, config_.n_layers);
}

template <typename T>
const T* Transformer<T>::forward_range(const int* tokens, const int* seq_offsets, int S,
                                       const T* x_in, int first, int last) {
  const T* result = nullptr;
  run_to_end(forward_range_pass(tokens, seq_offsets, S, x_in, first, last, &result));
  return result;
}

template <typename T>
ResumablePass Transformer<T>::forward_range_pass(const int* tokens, const int* seq_offsets, int S,
                                                 const T* x_in, int first, int last,
                                                 const T** result) {
  if (first < 0 || first > last || last > config_.n_layers || (first > 0 && !x_in) ||
      (!x_in && !tokens && seq_offsets[S] > 0)) {
    throw std::invalid_argument("Transformer::forward_range: layers [" + std::to_string(first) +
                                ", " + std::to_string(last) +
                                ") need 0 <= first <= last <= n_layers, and hidden rows when "
                                "first > 0, else tokens");
  }
  release_activations();
  activation_mark_ = device_.mark();
  has_activations_ = true;
  S_ = S;
  N_ = seq_offsets[S];
  int* offsets = device_.allocate<int>(size_t(S) + 1, "batch layout");
  std::memcpy(offsets, seq_offsets, (size_t(S) + 1) * sizeof(int));
  seq_offsets_ = offsets;
  first_layer_ = first;
  last_layer_ = last;
  tokens_ = nullptr;
  embedded_ = x_in == nullptr;
  if (embedded_) {
    tokens_ = device_.allocate<int>(size_t(N_), "batch tokens");
    // An empty batch (an expert-parallel rank with nothing to bring) may pass no token pointer.
    if (N_ > 0) std::memcpy(tokens_, tokens, size_t(N_) * sizeof(int));
  }
  positions_ = device_.allocate<int>(size_t(N_), "batch positions");
  for (int s = 0; s < S; ++s) {
    for (int t = offsets[s]; t < offsets[s + 1]; ++t) positions_[t] = t - offsets[s];
  }
  AttentionMode mode;
  mode.seq_offsets = seq_offsets_;
  mode.S = S;
  const T* x = nullptr;
  co_await run(tokens_, x_in, N_, positions_, mode, /*keep_activations=*/true, first, last, &x);
  if (last < config_.n_layers) {
    *result = x;
    co_return;
  }
  logits_ = const_cast<T*>(head(x, N_, /*keep_activations=*/true));
  *result = logits_;
}

template <typename T>
void Transformer<T>::release_activations() {
  if (!has_activations_) return;
  device_.release(activation_mark_);
  layers_.clear();
  has_activations_ = false;
}

template <typename T>
void Transformer<T>::backward(const T* dlogits, T aux_weight, const T* dhidden) {
  if (has_activations_ && (first_layer_ != 0 || last_layer_ != config_.n_layers)) {
    throw std::logic_error("Transformer::backward after a forward_range: use backward_range");
  }
  run_to_end(backward_layers(dlogits, dhidden, nullptr, aux_weight, nullptr));
}

template <typename T>
void Transformer<T>::backward_range(const T* dy, T aux_weight, T* dx_in) {
  run_to_end(backward_range_pass(dy, aux_weight, dx_in));
}

template <typename T>
ResumablePass Transformer<T>::backward_range_pass(const T* dy, T aux_weight, T* dx_in) {
  const bool head = last_layer_ == config_.n_layers;
  if (has_activations_ && !embedded_ && !dx_in) {
    throw std::invalid_argument(
        "Transformer::backward_range: a forward from hidden rows needs dx_in for their gradient");
  }
  co_await backward_layers(head ? dy : nullptr, nullptr, head ? nullptr : dy, aux_weight, dx_in);
}

template <typename T>
ResumablePass Transformer<T>::backward_layers(const T* dlogits, const T* dhidden, const T* dout,
                                              T aux_weight, T* dx_in) {
  if (!has_activations_) throw std::logic_error("Transformer::backward without forward");
  if (!grads_) throw std::logic_error("Transformer: model was built without gradients");
  const int C = config_.d_model, V = config_.vocab_size, N = N_;
  const int64_t NC = int64_t(N) * C;
  {
    T* dx = device_.allocate_zeroed<T>(NC, "backward work");
    if (last_layer_ == config_.n_layers) {
      T* dnormed = device_.allocate_zeroed<T>(NC, "backward work");
      if (dlogits) {
        ops_.matmul_backward(dnormed, grads_ + layout_.lm_head(), dlogits, final_out_,
                             params_ + layout_.lm_head(), N, C, V, device_);
      }
      if (dhidden) {
        ops_.add(dnormed, dnormed, dhidden, NC, device_);
      }
      ops_.rmsnorm_backward(dx, grads_ + layout_.final_norm(), dnormed, final_in_,
                            params_ + layout_.final_norm(), final_rstd_, N, C, device_);
    } else {
      copy_bytes(dx, dout, size_t(NC) * sizeof(T));
    }
    for (int l = last_layer_ - 1; l >= first_layer_; --l) {
      co_await layer_backward(l, layers_[size_t(l - first_layer_)], dx, N, positions_, aux_weight);
    }
    if (embedded_) {
      ops_.embedding_backward(grads_ + layout_.embedding(), dx, tokens_, N, C, V, device_);
    } else {
      copy_bytes(dx_in, dx, size_t(NC) * sizeof(T));
    }
  }
  release_activations();
}

template <typename T>
ResumablePass Transformer<T>::layer_backward(int l, const Layer& a, T* dx, int N,
                                             const int* positions, T aux_weight) {
  const LayerOffsets& o = layout_.layer(l);
  const int C = config_.d_model, D = config_.head_dim();
  const int H = layout_.local_heads(), A = layout_.attention_width();  // this TP rank's heads
  const int64_t NC = int64_t(N) * C, NA = int64_t(N) * A;
  ArenaScope scope(device_);
  // x_out = x_mid + moe_out: both receive dx.
  T* dx_mid = device_.allocate<T>(size_t(NC), "backward work");
  copy_bytes(dx_mid, dx, size_t(NC) * sizeof(T));  // (on a GPU: a device copy, not the host)
  T* dxn2 = device_.allocate_zeroed<T>(NC, "backward work");
  co_await moe_.backward(moe_weights(layout_, params_, experts_, l),
                         moe_weights(layout_, grads_, expert_grads_, l), a.xn2, a.moe, dx, dxn2, N,
                         aux_weight, dispatcher(l), overlap(l));
  co_await progress_point();
  ops_.rmsnorm_backward(dx_mid, grads_ + o.ffn_norm, dxn2, a.x_mid, params_ + o.ffn_norm, a.rstd2,
                        N, C, device_);
  // x_mid = x_in + att @ wo^T.
  T* datt = device_.allocate_zeroed<T>(NA, "backward work");
  ops_.matmul_backward(datt, grads_ + o.wo, dx_mid, a.att, params_ + o.wo, N, A, C, device_);
  T* dq = device_.allocate_zeroed<T>(NA, "backward work");
  T* dk = device_.allocate_zeroed<T>(NA, "backward work");
  T* dv = device_.allocate_zeroed<T>(NA, "backward work");
  co_await progress_point();
  // In pieces of whole sequences, as the forward (each piece's rows the bits of one call).
  for (const SequenceRange& piece : attention_pieces(S_)) {
    ops_.attention_backward(dq, dk, dv, datt, a.att, a.lse, a.q, a.k, a.v,
                            seq_offsets_ + piece.first, piece.count, H, D, device_);
    co_await progress_point();
  }
  T* dq_pre = device_.allocate_zeroed<T>(NA, "backward work");
  T* dk_pre = device_.allocate_zeroed<T>(NA, "backward work");
  ops_.rope_backward(dq_pre, dq, positions, N, H, D, config_.rope_theta, device_);
  ops_.rope_backward(dk_pre, dk, positions, N, H, D, config_.rope_theta, device_);
  T* dxn1 = device_.allocate_zeroed<T>(NC, "backward work");
  ops_.matmul_backward(dxn1, grads_ + o.wq, dq_pre, a.xn1, params_ + o.wq, N, C, A, device_);
  ops_.matmul_backward(dxn1, grads_ + o.wk, dk_pre, a.xn1, params_ + o.wk, N, C, A, device_);
  ops_.matmul_backward(dxn1, grads_ + o.wv, dv, a.xn1, params_ + o.wv, N, C, A, device_);
  tensor_parallel_sum(dxn1, NC);  // column-parallel Q/K/V: the heads' partial input gradients
  // x_in feeds both the residual (dx_mid) and the attention norm.
  copy_bytes(dx, dx_mid, size_t(NC) * sizeof(T));
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
  // With tensor parallelism only this rank's heads.
  const int width = layout_.attention_width();
  const size_t per_layer = size_t(slots) * size_t(max_len) * size_t(width);
  for (int l = 0; l < config_.n_layers; ++l) {
    if (!layout_.stores_layer(l)) {  // another stage's layer: never run here
      cache.keys.emplace_back();
      cache.values.emplace_back();
      continue;
    }
    cache.keys.emplace_back(device_.allocate<T>(per_layer, "KV cache"),
                            std::initializer_list<int64_t>{slots, max_len, width});
    cache.values.emplace_back(device_.allocate<T>(per_layer, "KV cache"),
                              std::initializer_list<int64_t>{slots, max_len, width});
  }
  return cache;
}

template <typename T>
void Transformer<T>::check_range(const T* x_in, int first, int last, const char* caller) const {
  if (first < 0 || first > last || last > config_.n_layers || (first > 0 && !x_in)) {
    throw std::invalid_argument("Transformer::" + std::string(caller) + ": layers [" +
                                std::to_string(first) + ", " + std::to_string(last) +
                                ") need 0 <= first <= last <= n_layers, and hidden rows when "
                                "first > 0");
  }
}

template <typename T>
const T* Transformer<T>::prefill(KVCache<T>& cache, const int* tokens, const int* seq_offsets,
                                 int S, const int* slots) {
  return prefill_range(cache, tokens, nullptr, seq_offsets, S, slots, 0, config_.n_layers);
}

template <typename T>
const T* Transformer<T>::prefill_range(KVCache<T>& cache, const int* tokens, const T* x_in,
                                       const int* seq_offsets, int S, const int* slots, int first,
                                       int last) {
  check_range(x_in, first, last, "prefill_range");
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
  const T* x = nullptr;
  run_to_end(run(tokens, x_in, N, positions, mode, /*keep_activations=*/false, first, last, &x));
  if (last < config_.n_layers) return x;
  T* last_rows = device_.allocate<T>(size_t(S) * C, "prefill last tokens");
  for (int s = 0; s < S; ++s) {
    std::memcpy(last_rows + int64_t(s) * C, x + int64_t(seq_offsets[s + 1] - 1) * C,
                size_t(C) * sizeof(T));
  }
  return head(last_rows, S, /*keep_activations=*/false);
}

template <typename T>
const T* Transformer<T>::decode(KVCache<T>& cache, const int* tokens, const int* slots,
                                const int* positions, int B) {
  return decode_range(cache, tokens, nullptr, slots, positions, B, 0, config_.n_layers);
}

template <typename T>
const T* Transformer<T>::decode_range(KVCache<T>& cache, const int* tokens, const T* x_in,
                                      const int* slots, const int* positions, int B, int first,
                                      int last) {
  check_range(x_in, first, last, "decode_range");
  AttentionMode mode;
  mode.kind = AttentionMode::Decode;
  mode.cache = &cache;
  mode.token_slots = slots;
  const T* x = nullptr;
  run_to_end(run(tokens, x_in, B, positions, mode, /*keep_activations=*/false, first, last, &x));
  return last < config_.n_layers ? x : head(x, B, /*keep_activations=*/false);
}

template class Transformer<float>;
template class Transformer<double>;

}  // namespace rlf
