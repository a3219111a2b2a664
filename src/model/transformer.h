// The decoder-only MoE transformer on one device: pre-norm blocks of causal attention (RoPE) and a
// top-k routed SwiGLU mixture of experts (plus an optional shared expert), a final RMSNorm and an
// untied LM head. All math goes through an Ops table (reference or fast backend); all memory comes
// from the device arena, so its peak is the model's true footprint.
//
// Expert parallelism (set_expert_parallel): each rank of an EP group runs the model on its own
// tokens and every layer's routed experts through that layer's ExpertDispatcher, which runs only
// this rank's local experts. A model built with an ExpertShard stores only its own experts
// (zero redundancy); a model with the full layout also runs EP and then reads and gets gradients
// only for its local experts' slices of w1/w3/w2. Non-expert tensors are replicated.
//
// Tensor parallelism (a TensorParallel given to the constructor; src/model/tensor_parallel.h):
// the model holds its TP rank's slice of the layout (its heads of wq/wk/wv/wo, its part of the
// shared expert), runs attention on its heads only (the KV cache holds only them) and sums the
// partial outputs over the TP group: every forward, backward, prefill and decode is collective
// over the group, whose ranks must bring the same tokens. Float only.
//
// Routed experts are read through an ExpertTable (one pointer per expert), so a model can also be
// a view: the replicated tensors of another model where they are, and experts wherever the table
// points (RL Fusion's generation layout: held experts in place, received ones in pool slots).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/ops.h"
#include "src/model/kv_cache.h"
#include "src/model/model_config.h"
#include "src/model/moe_block.h"
#include "src/model/parameter_layout.h"
#include "src/model/resumable_pass.h"

namespace rlf {

class Arena;
class ExpertDispatcher;
class OverlappedExperts;
class TensorParallel;

template <typename T>
class Transformer {
 public:
  // Allocates parameters (and gradients when with_gradients) in `device`; with an expert shard,
  // only those routed experts (the model then runs only with expert parallelism over
  // dispatchers whose local experts are exactly the shard).
  // With a layer shard (a pipeline stage), only those layers (and the embedding and head where
  // the shard has them); such a model runs with forward_range and backward_range only.
  // With `tp` (not owned), its TP rank's slice (tp->slice()) of the tensor-parallel tensors.
  Transformer(const ModelConfig& config, const Ops<T>& ops, Arena& device, bool with_gradients,
              ExpertShard experts = {}, LayerShard layers = {}, const TensorParallel* tp = nullptr);
  // A second model over `shared`'s parameters and gradients (not copied; `shared` must outlive
  // it) whose activations and work buffers live in `activations`. A pipeline stage keeps one per
  // micro-batch in flight, each in its own arena, so a micro-batch's activations are freed when
  // its backward ends whatever the order; their gradients add up in the one shared buffer.
  Transformer(const Transformer& shared, Arena& activations);
  // A view for inference (no gradients, no parameters of its own): the replicated tensors of
  // `storage` (not copied; it must outlive the view) and the routed experts `experts` points at,
  // one table per layer (complete; its shard is the experts this model runs). Throws
  // std::invalid_argument otherwise.
  Transformer(const Transformer& storage, ExpertTable<T> experts);
  // A stitched view for inference (no gradients, no parameters of its own) over two models of one
  // config that together store every layer, the embedding and the head, with the same routed
  // experts (with redundant slots the same slots: the view's expert table runs over them) and the
  // same TP group (or none: with one, both hold its rank's slice and the view runs collectively
  // over it): each layer (its experts too), the embedding and the head are read where `first`
  // stores them, else where `second` does (neither copied; both must outlive the view). A pipeline
  // stage generates so from its own layers and the other stages' received into `second` (RL
  // Fusion's PP layout switch). Its layout is the whole model's and parameters() is null: its
  // tensors are in two buffers. Throws std::invalid_argument when the two do not fit together so.
  Transformer(const Transformer& first, const Transformer& second);
  ~Transformer();
  Transformer(const Transformer&) = delete;
  Transformer& operator=(const Transformer&) = delete;

  const ModelConfig& config() const { return config_; }
  // Where parameters() holds each tensor (a view: its storage's layout, whose experts the view
  // need not run).
  const ParameterLayout& layout() const { return layout_; }
  // The routed experts this model runs and where each one is.
  const ExpertTable<T>& experts() const { return experts_; }
  const Ops<T>& ops() const { return ops_; }
  Arena& device() const { return device_; }
  T* parameters() const { return params_; }
  T* gradients() const { return grads_; }
  int64_t parameter_count() const { return layout_.total(); }
  // The tensor-parallel group (null without tensor parallelism).
  const TensorParallel* tensor_parallel() const { return tp_; }

  // `per_layer[l]` (n_layers entries, each a distinct dispatcher over the same EP group with
  // n_experts experts) runs layer l's routed experts; an empty vector turns EP off. Each layer
  // needs its own dispatcher because a dispatcher keeps its last routing plan for backward.
  // With EP every forward, backward, prefill and decode is collective over the EP group (ranks
  // may bring zero tokens); float only. Not owned.
  void set_expert_parallel(std::vector<ExpertDispatcher*> per_layer);
  bool expert_parallel() const { return !expert_parallel_.empty(); }
  // Layer l's dispatcher (null without expert parallelism): its router statistics.
  ExpertDispatcher* expert_dispatcher(int l) const { return dispatcher(l); }
  // Tensor parallelism without duplicated routed-expert work (MoeBlock::set_token_split): each
  // rank of the TP group computes only its share of the rows' routed experts in every MoE layer
  // (training, prefill and decode), through its EP dispatcher or, without EP, on its own copy of
  // the experts, and the TP group allgathers the combined rows, so the expert gradients cover
  // only this rank's share (sum them over the TP group). Needs tensor parallelism
  // (std::logic_error) and takes effect with the EP dispatchers and the overlap chunks alike.
  void set_expert_token_split(bool split);
  bool expert_token_split() const { return moe_.token_split() != nullptr; }
  // Routed rows this rank's experts computed without a dispatcher (MoeBlock::local_routed_rows).
  int64_t local_routed_rows() const { return moe_.local_routed_rows(); }
  // Token x top-k assignments to each expert of layer l that this rank's training forwards
  // (packed rows without a KV cache: training and log-probs, not generation) routed without a
  // dispatcher (with the token split, its share of the rows), since the last call; views made
  // from this model count into it. The router statistics of a run without expert parallelism
  // (with it the dispatchers count: ExpertDispatcher::take_expert_tokens).
  std::vector<int64_t> take_local_expert_tokens(int l);
  // The same forwards' (layer, call) pairs and the routed experts each gave rows to, summed since
  // the last call: what a call's expert FFN reads (the planner's RlJob::active_experts is
  // touched / calls).
  struct TouchedExperts {
    int64_t calls = 0, touched = 0;
  };
  TouchedExperts take_touched_experts();
  // Training forward and backward then run layer l's routed experts through `per_layer[l]`
  // (chunked, transfers overlapped with the expert FFN; same EP group and experts as the
  // dispatchers); prefill and decode keep the dispatchers. Empty: off. Not owned.
  void set_expert_overlap(std::vector<OverlappedExperts*> per_layer);
  // Layer l's overlapped experts (null without overlap): the router statistics of its chunks.
  OverlappedExperts* expert_overlap(int l) const { return overlap(l); }
  // With expert parallelism: whether `local` holds on any rank of the EP group (collective);
  // without: `local`. Generation asks it so a rank whose sequences are all done keeps stepping
  // with zero rows until every rank of the group is done.
  bool on_any_expert_parallel_rank(bool local) const;

  // Allocates a zeroed gradient buffer at the top of the device arena (the constructor does so
  // when with_gradients): for a model built without gradients, or again after the arena was
  // rewound past them (RL Fusion's offload, which zeroes with streaming stores: the buffer is
  // zeroed again before the next backward). Returns it. Not for a view (std::logic_error).
  enum class Zeroing { Cached, Streaming };
  T* allocate_gradients(Zeroing zeroing = Zeroing::Cached);

  void initialize(uint64_t seed);  // not for a view (std::logic_error)
  void zero_gradients();

  // Training forward over S packed sequences (tokens[N], N = seq_offsets[S]); keeps activations
  // for backward(). Returns logits [N, V], valid until backward() or release_activations().
  const T* forward(const int* tokens, const int* seq_offsets, int S);
  // Sum over layers of the router load-balancing loss of the last forward (unscaled).
  T aux_loss() const { return aux_loss_; }
  // The final-norm output of the last training forward [N, d_model] (what the LM head reads, and
  // what a scalar head reads), valid until backward() or release_activations().
  const T* final_hidden() const { return final_out_; }
  // Adds the gradient of sum(dlogits . logits) + sum(dhidden . final_hidden()) + aux_weight *
  // aux_loss() into gradients(), then releases the activations. A null dlogits or dhidden is a
  // zero term (a scalar-head model passes only dhidden).
  void backward(const T* dlogits, T aux_weight, const T* dhidden = nullptr);
  void release_activations();

  // Pipeline parallelism: a training forward through layers [first, last) only, on hidden rows
  // `x_in` [N, d_model] that enter layer `first` (copied; null only when first == 0: the embedding
  // of `tokens`, which is read only then). With last == n_layers the final norm and head run too
  // and the result is logits [N, V]; otherwise it is the hidden rows leaving layer last - 1 [N,
  // d_model]. aux_loss() sums the range's layers. Valid until backward_range() or
  // release_activations().
  const T* forward_range(const int* tokens, const int* seq_offsets, int S, const T* x_in, int first,
                         int last);
  // The backward of the last forward_range: `dy` is the gradient of its result (dlogits when it
  // ran the head). Adds the range's parameter gradients into gradients(), writes the gradient of
  // x_in into dx_in [N, d_model] (the embedding's gradient when the forward embedded tokens),
  // then releases the activations.
  void backward_range(const T* dy, T aux_weight, T* dx_in);
  // The same two as resumable passes (src/model/resumable_pass.h): with expert parallelism they
  // stop at every MoE layer's exchanges, so a driver can run another pass meanwhile (pipeline
  // pairing, src/model/pass_pair.h). forward_range_pass sets `*result` when it ends.
  ResumablePass forward_range_pass(const int* tokens, const int* seq_offsets, int S, const T* x_in,
                                   int first, int last, const T** result);
  ResumablePass backward_range_pass(const T* dy, T aux_weight, T* dx_in);

  // Generation. The cache lives in device memory until the arena is rewound past it: keys and
  // values of the layers this model stores (a pipeline stage's only).
  KVCache<T> allocate_kv_cache(int slots, int max_len);
  // Runs S prompts (packed) and fills their cache slots from position 0. Returns logits of each
  // prompt's last token [S, V], valid until the caller rewinds the arena.
  const T* prefill(KVCache<T>& cache, const int* tokens, const int* seq_offsets, int S,
                   const int* slots);
  // One token for each of B sequences: tokens[b] at positions[b] in cache slot slots[b]; returns
  // logits [B, V], valid until the caller rewinds the arena.
  const T* decode(KVCache<T>& cache, const int* tokens, const int* slots, const int* positions,
                  int B);
  // The same over layers [first, last) only (a pipeline stage generating, pipeline_generation.h):
  // on the embedding of `tokens` when x_in is null (first must be 0), else on the hidden rows
  // x_in [N, d_model] leaving layer first - 1; filling the cache of those layers. With last ==
  // n_layers the final norm and head run too and the result is the logits (prefill: of each
  // prompt's last token [S, V]); otherwise the hidden rows leaving layer last - 1 ([N, d_model],
  // every token of the prompts). Valid until the caller rewinds the arena.
  const T* prefill_range(KVCache<T>& cache, const int* tokens, const T* x_in,
                         const int* seq_offsets, int S, const int* slots, int first, int last);
  const T* decode_range(KVCache<T>& cache, const int* tokens, const T* x_in, const int* slots,
                        const int* positions, int B, int first, int last);

 private:
  struct Layer;          // one layer's saved activations
  struct AttentionMode;  // packed training attention, prefill, or cached decode

  // Layers [first, last) on x_in, or on the embedding of tokens when x_in is null; the result
  // into `*result`.
  ResumablePass run(const int* tokens, const T* x_in, int N, const int* positions,
                    const AttentionMode& mode, bool keep_activations, int first, int last,
                    const T** result);
  // The backward of the last training forward: from dlogits (+ dhidden) through the head when it
  // ran, else from dout (the gradient of the range's hidden output); into dx_in or the embedding.
  ResumablePass backward_layers(const T* dlogits, const T* dhidden, const T* dout, T aux_weight,
                                T* dx_in);
  ResumablePass layer_forward(int l, Layer& a, const T* x_in, T* x_out, int N, const int* positions,
                              const AttentionMode& mode);
  // The layer's keys and values of N tokens into the cache (prefill, decode).
  void store_in_cache(int l, const Layer& a, int N, const int* positions,
                      const AttentionMode& mode);
  // A decode step's attention of N tokens over their cached sequences.
  void decode_attention(int l, Layer& a, int N, const int* positions, const AttentionMode& mode);
  ResumablePass layer_backward(int l, const Layer& a, T* dx, int N, const int* positions,
                               T aux_weight);
  Layer allocate_layer(int N);
  ExpertDispatcher* dispatcher(int l) const {
    return expert_parallel_.empty() ? nullptr : expert_parallel_[size_t(l)];
  }
  OverlappedExperts* overlap(int l) const {
    return overlap_.empty() ? nullptr : overlap_[size_t(l)];
  }
  // std::invalid_argument (naming `caller`) unless 0 <= first <= last <= n_layers with hidden
  // rows x_in when first > 0.
  void check_range(const T* x_in, int first, int last, const char* caller) const;
  // Final RMSNorm and LM head over N hidden rows.
  const T* head(const T* x, int N, bool keep_activations);
  // Where layer l's tensors are (its base and offsets) and the embedding and head: params_ and
  // layout_, or a stitched view's sources.
  T* layer_parameters(int l) const;
  const LayerOffsets& layer_offsets(int l) const;
  T* embedding_parameters() const;
  T* final_norm_parameters() const;
  T* lm_head_parameters() const;
  // Tensor parallelism: sums data[count] over the TP group (nothing without TP).
  void tensor_parallel_sum(T* data, int64_t count) const;

  ModelConfig config_;
  ParameterLayout layout_;
  const Ops<T>& ops_;
  Arena& device_;
  MoeBlock<T> moe_;
  std::vector<ExpertDispatcher*> expert_parallel_;  // per layer; empty: no EP
  std::vector<OverlappedExperts*> overlap_;         // per layer; empty: no overlap
  const TensorParallel* tp_ = nullptr;
  T* params_ = nullptr;
  T* grads_ = nullptr;
  ExpertTable<T> experts_, expert_grads_;  // the routed experts in params_ / grads_ (or a view's)
  bool view_ = false;
  // A stitched view's sources (empty otherwise): per layer the base its offsets are from.
  struct Stitch {
    std::vector<T*> layer_base;
    std::vector<LayerOffsets> layer_offsets;
    T *embedding = nullptr, *final_norm = nullptr, *lm_head = nullptr;
  };
  std::shared_ptr<const Stitch> stitch_;
  // take_local_expert_tokens' counts, [layer * E + expert], and take_touched_experts'; shared with
  // the views.
  struct RouterCounts {
    explicit RouterCounts(const ModelConfig& config)
        : expert_tokens(size_t(config.n_layers) * size_t(config.n_experts), 0) {}
    std::vector<int64_t> expert_tokens;
    TouchedExperts touched;
  };
  std::shared_ptr<RouterCounts> router_counts_;

  // State of the last training forward.
  bool has_activations_ = false;
  size_t activation_mark_ = 0;
  int N_ = 0, S_ = 0;
  int first_layer_ = 0, last_layer_ = 0;  // the layer range it ran
  bool embedded_ = false;                 // from tokens (else from hidden rows)
  const int* seq_offsets_ = nullptr;
  int* positions_ = nullptr;
  int* tokens_ = nullptr;
  std::vector<Layer> layers_;
  const T* final_in_ = nullptr;
  T* final_out_ = nullptr;
  T* final_rstd_ = nullptr;
  T* logits_ = nullptr;
  T aux_loss_ = T(0);
};

}  // namespace rlf
