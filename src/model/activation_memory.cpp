#include "src/model/activation_memory.h"

#include <algorithm>

#include "kernels/arena.h"
#include "src/model/attention_pieces.h"
#include "src/model/tensor_parallel.h"

namespace rlf {

namespace {

// The cpu kernels' blocking constants their scratch sizes follow (tests/rl/test_activation_peak.cpp
// compares this model with the arena, so a kernel that changes its scratch shows there).
constexpr int64_t kAttentionBlock = 64;        // kernels/cpu/attention.cpp kBlock
constexpr int64_t kAttentionMaxChunks = 64;    // kernels/cpu/attention.cpp kMaxChunks
constexpr int64_t kDecodeMinWork = 1 << 15;    // attention_decode: multiply-adds per chunk
constexpr int64_t kExpertRowBlock = 128;       // kernels/cpu/moe.cpp kRowBlock
constexpr int64_t kRouterTokenGrain = 256;     // kernels/cpu/router.cpp kTokenGrain
constexpr int64_t kAuxBlock = 1024;            // kernels/cpu/router.cpp kAuxBlock
constexpr int64_t kRmsnormMinChunk = 1 << 14;  // kernels/cpu/rmsnorm.cpp kMinChunkFloats
constexpr int64_t kRmsnormMaxRowBlocks = 16;   // kernels/cpu/rmsnorm.cpp kMaxRowBlocks
constexpr int64_t kSamplingMaxChunks = 64;     // kernels/cpu/sampling.cpp

int64_t blocks(int64_t n, int64_t block) {
  return (n + block - 1) / block;
}

// Arena::allocate_bytes rounds every allocation up to the alignment.
template <typename T>
size_t bytes(int64_t count) {
  const size_t a = Arena::kAlignment;
  return (size_t(std::max<int64_t>(count, 0)) * sizeof(T) + a - 1) / a * a;
}

// A bump arena's use and high-water mark, replayed from the sizes the code allocates.
class Tally {
 public:
  template <typename T>
  void hold(int64_t count) {
    used_ += bytes<T>(count);
    peak_ = std::max(peak_, used_);
  }
  // A kernel's scratch: above everything held, released before the kernel returns.
  void scratch(size_t scratch_bytes) { peak_ = std::max(peak_, used_ + scratch_bytes); }
  size_t mark() const { return used_; }
  void release(size_t mark) { used_ = mark; }
  size_t peak() const { return peak_; }

 private:
  size_t used_ = 0, peak_ = 0;
};

// The tokens of N whose routed experts this rank computes: all of them, or with the token split
// its TP rank's share: on its own experts (TP without EP, MoeBlock::routed_forward_local), or
// dispatched over its EP group (TP x EP, routed_forward_ep: the rank then receives, as every EP
// count here assumes, the balanced share of its group's dispatched rows, i.e. as many as it
// dispatched).
struct RoutedShare {
  bool split = false;
  TensorSlice slice;
  int64_t tokens(int64_t N) const {
    return split ? tensor_parallel_row_share(int(N), slice.size, slice.rank).count : N;
  }
};

RoutedShare routed_share(const ParameterLayout& layout, bool expert_token_split) {
  return {expert_token_split && layout.tensor_slice().active(), layout.tensor_slice()};
}

// --- kernel scratch (kernels/cpu/*.cpp) ---

// rope.cpp build_table: inverse frequencies and a cos and a sin table of `rows` positions.
size_t rope_scratch(int64_t rows, int D) {
  const int64_t half = D / 2;
  return bytes<double>(std::max<int64_t>(half, 1)) + 2 * bytes<float>(rows * half);
}

// attention.cpp: at most kMaxChunks fixed chunks of `items` (chunk_grain), or fewer when each
// chunk must hold `min_grain` items.
int64_t attention_chunks(int64_t items, int64_t min_grain = 1) {
  const int64_t grain = std::max({int64_t(1), blocks(items, kAttentionMaxChunks), min_grain});
  return blocks(items, grain);
}

// The pieces of whole sequences the transformer calls attention over (attention_pieces), each
// as a batch of its own.
std::vector<PackedBatch> attention_piece_batches(const PackedBatch& batch) {
  std::vector<PackedBatch> pieces;
  for (const SequenceRange& piece : attention_pieces(int(batch.lengths.size()))) {
    const auto first = batch.lengths.begin() + piece.first;
    pieces.push_back(packed_batch(std::vector<int>(first, first + piece.count)));
  }
  return pieces;
}

// attention_forward of one call: (sequence, query block) pairs, and per chunk a score tile, an
// accumulator and the running max and sum.
size_t attention_forward_call_scratch(const PackedBatch& batch, int H, int D) {
  if (batch.sequences <= 0 || batch.query_blocks == 0) return 0;
  const int64_t per_chunk =
      kAttentionBlock * kAttentionBlock + kAttentionBlock * D + 2 * kAttentionBlock;
  return 2 * bytes<int>(batch.query_blocks) +
         bytes<float>(attention_chunks(batch.query_blocks * H) * per_chunk);
}

// The largest of the pieces' calls (each releases its scratch before the next).
size_t attention_forward_scratch(const PackedBatch& batch, int H, int D) {
  size_t largest = 0;
  for (const PackedBatch& piece : attention_piece_batches(batch))
    largest = std::max(largest, attention_forward_call_scratch(piece, H, D));
  return largest;
}

// attention_decode: one score row of the longest cached sequence per chunk of (row, head) items.
size_t attention_decode_scratch(int64_t rows, int H, int D, int64_t longest) {
  if (rows <= 0) return 0;
  const int64_t min_items = std::max<int64_t>(1, kDecodeMinWork / (longest * D * 2));
  return bytes<float>(attention_chunks(rows * H, min_items) * longest);
}

// attention_backward of one call: delta per (token, head), and per chunk of (sequence, head)
// items two tiles and the dK and dV accumulators.
size_t attention_backward_call_scratch(const PackedBatch& batch, int H, int D) {
  if (batch.sequences <= 0) return 0;
  const int64_t per_chunk = 2 * kAttentionBlock * kAttentionBlock + 2 * kAttentionBlock * D;
  return bytes<float>(batch.tokens * H) +
         bytes<float>(attention_chunks(int64_t(batch.sequences) * H) * per_chunk);
}

// The largest of the pieces' calls.
size_t attention_backward_scratch(const PackedBatch& batch, int H, int D) {
  size_t largest = 0;
  for (const PackedBatch& piece : attention_piece_batches(batch))
    largest = std::max(largest, attention_backward_call_scratch(piece, H, D));
  return largest;
}

// router.cpp router_aux_loss_forward: a sum and a count per expert and block of tokens.
size_t aux_loss_scratch(int64_t N, int E) {
  if (N <= 0) return 0;
  return bytes<double>(blocks(N, kAuxBlock) * E) + bytes<int64_t>(blocks(N, kAuxBlock) * E);
}

// router.cpp router_backward: one gradient row per chunk of tokens.
size_t router_backward_scratch(int64_t N, int E) {
  return N <= 0 ? 0 : bytes<float>(blocks(N, kRouterTokenGrain) * E);
}

// moe.cpp make_row_tasks plus expert_ffn_forward's h, all `rows` rows over `experts` experts.
size_t expert_ffn_forward_scratch(int64_t rows, int experts, int F) {
  if (rows <= 0) return 0;
  return bytes<int64_t>(experts + 1) + bytes<float>(rows * F);
}

// expert_ffn_backward: the tasks, h, da, db and a sigmoid row per task. The task count (row
// blocks of each expert) depends on the routing: counted at its bound, one partial block per
// expert holding rows.
size_t expert_ffn_backward_scratch(int64_t rows, int experts, int F) {
  if (rows <= 0) return 0;
  const int64_t tasks =
      blocks(rows + (kExpertRowBlock - 1) * std::min<int64_t>(experts, rows), kExpertRowBlock);
  return bytes<int64_t>(experts + 1) + 3 * bytes<float>(rows * F) + bytes<float>(tasks * F);
}

// rmsnorm.cpp rmsnorm_backward: weight-gradient partials per row block.
size_t rmsnorm_backward_scratch(int64_t N, int C) {
  if (N <= 0) return 0;
  const int64_t grain = std::max(std::max<int64_t>(1, kRmsnormMinChunk / std::max(C, 1)),
                                 blocks(N, kRmsnormMaxRowBlocks));
  return bytes<float>(blocks(N, grain) * C);
}

// sampling.cpp sample_tokens: probabilities and an order per chunk of rows (none when greedy).
size_t sampling_scratch(int64_t rows, int V, bool sampled) {
  if (!sampled || rows <= 0) return 0;
  const int64_t chunks = blocks(rows, blocks(rows, kSamplingMaxChunks));
  return bytes<float>(chunks * V) + bytes<int>(chunks * V);
}

// --- the model's allocations (src/model/) ---

// Routed experts of a layout: with expert parallelism the rank's own (the dispatcher's local ones).
int routed_experts(const ModelConfig& config, const ParameterLayout& layout) {
  return layout.expert_sharded() ? layout.stored_experts() : config.n_experts;
}

// Transformer::allocate_layer and MoeBlock::allocate for N tokens. With tensor parallelism Q, K, V,
// the attention output and the shared expert's hidden units hold only the rank's slice.
void hold_layer(Tally& t, const ModelConfig& config, const ParameterLayout& layout,
                const RoutedShare& share, int64_t N) {
  const bool expert_parallel = layout.expert_sharded();
  const int64_t C = config.d_model, H = layout.local_heads(), E = config.n_experts;
  const int64_t A = layout.attention_width();
  const int64_t M = N * config.top_k, F = config.d_ff, S = layout.shared_width();
  const int64_t R = share.tokens(N) * config.top_k;  // the routed rows this rank computes
  t.hold<float>(N * C);                              // xn1
  t.hold<float>(N);                                  // rstd1
  for (int i = 0; i < 4; ++i) t.hold<float>(N * A);  // q, k, v, att
  t.hold<float>(N * H);                              // lse
  t.hold<float>(N * C);                              // x_mid
  t.hold<float>(N * C);                              // xn2
  t.hold<float>(N);                                  // rstd2
  t.hold<float>(N * C);                              // moe_out
  t.hold<float>(N * E);                              // router_logits
  t.hold<float>(N * E);                              // probs
  t.hold<float>(M);                                  // expert_weight
  t.hold<int>(M);                                    // expert_idx
  if (!expert_parallel) {
    t.hold<int>(E + 1);    // expert_offsets
    t.hold<int>(R);        // row_of_assignment
    t.hold<int>(R);        // token_of_row
    t.hold<float>(R * C);  // xg
    t.hold<float>(R * F);  // ffn_a
    t.hold<float>(R * F);  // ffn_b
    t.hold<float>(R * C);  // y
  }
  if (config.shared_expert_d_ff > 0) {
    t.hold<float>(N * S);  // shared_a
    t.hold<float>(N * S);  // shared_b
    t.hold<float>(N * C);  // shared_y
    t.hold<int>(2);        // shared_offsets
  }
}

// Transformer::layer_forward after allocate_layer: RoPE, attention (packed over `packed`, or a
// decode step over a cache of `decode_longest` positions), then MoeBlock::forward.
void layer_forward(Tally& t, const ModelConfig& config, const ParameterLayout& layout,
                   const RoutedShare& share, int64_t N, const PackedBatch* packed,
                   int decode_longest) {
  const int H = layout.local_heads(), D = config.head_dim(), C = config.d_model, F = config.d_ff;
  const int longest = packed ? packed->longest : decode_longest;
  // A table row per position spanned, or per token when the span is longer.
  t.scratch(rope_scratch(std::min<int64_t>(N, longest), D));  // q, then k
  if (packed) {
    t.scratch(attention_forward_scratch(*packed, H, D));
  } else {
    const size_t mark = t.mark();
    t.hold<int>(N);  // decode_attention: decode lengths
    t.scratch(attention_decode_scratch(N, H, D, decode_longest));
    t.release(mark);
  }
  t.scratch(aux_loss_scratch(N, config.n_experts));
  // Routed rows: top_k per token (with the token split, of the rank's share); with expert
  // parallelism the rank's balanced share.
  const int64_t rows = share.tokens(N) * config.top_k;
  const int experts = routed_experts(config, layout);
  if (layout.expert_sharded()) {
    // MoeBlock::routed_forward_ep: the dispatched rows, allocated once their count is known.
    t.hold<int>(experts + 1);
    t.hold<float>(rows * C);
    t.hold<float>(rows * F);
    t.hold<float>(rows * F);
    t.hold<float>(rows * C);
  }
  t.scratch(expert_ffn_forward_scratch(rows, experts, F));
  if (config.shared_expert_d_ff > 0) {
    t.scratch(expert_ffn_forward_scratch(N, 1, layout.shared_width()));
  }
}

// Transformer::head: the final norm and the logits of N rows.
void hold_head(Tally& t, const ModelConfig& config, int64_t N) {
  t.hold<float>(N);                               // rstd
  t.hold<float>(N * config.d_model);              // normed
  t.hold<float>(N * int64_t(config.vocab_size));  // logits
}

// Transformer::run without saved activations (prefill, decode): two residual buffers, each layer's
// activations released after it; then the head.
void inference_pass(Tally& t, const ModelConfig& config, const ParameterLayout& layout,
                    const RoutedShare& share, int64_t N, const PackedBatch* packed,
                    int decode_longest) {
  t.hold<float>(N * config.d_model);  // x
  t.hold<float>(N * config.d_model);  // x_next
  for (int l = 0; l < config.n_layers; ++l) {
    const size_t mark = t.mark();
    hold_layer(t, config, layout, share, N);
    layer_forward(t, config, layout, share, N, packed, decode_longest);
    t.release(mark);
  }
}

// Transformer::layer_backward (with MoeBlock::backward inside) over the saved activations.
void layer_backward(Tally& t, const ModelConfig& config, const ParameterLayout& layout,
                    const RoutedShare& share, const PackedBatch& batch) {
  const int64_t N = batch.tokens, C = config.d_model, F = config.d_ff, K = config.top_k;
  const int E = config.n_experts, H = layout.local_heads(), D = config.head_dim();
  const int64_t A = layout.attention_width();
  const int64_t own = share.tokens(N), rows = own * K;
  const size_t layer_mark = t.mark();
  t.hold<float>(N * C);  // dx_mid
  t.hold<float>(N * C);  // dxn2
  const size_t moe_mark = t.mark();
  if (config.shared_expert_d_ff > 0) {
    // With TP the rank's hidden units give a partial input gradient of their own (summed over
    // the group), held to the end of the MoE backward.
    if (layout.tensor_slice().splits_shared_expert()) t.hold<float>(N * C);  // dx_shared
    t.scratch(expert_ffn_backward_scratch(N, 1, layout.shared_width()));
  }
  t.hold<float>(N * K);  // dweight
  if (share.split && !layout.expert_sharded()) {
    // routed_backward_local's buffers of this rank's rows (the EP path's come from the
    // dispatcher, outside the arena).
    t.hold<float>(own * C);  // dx_rows
    t.hold<float>(rows);     // dweight_rows
  }
  if (!layout.expert_sharded()) {
    t.hold<float>(rows * C);  // dy
  }
  t.hold<float>(rows * C);  // dxg
  t.scratch(expert_ffn_backward_scratch(rows, routed_experts(config, layout), F));
  // gather_split_backward: every row's input and top-k weight gradients, allgathered.
  if (share.split) t.scratch(bytes<float>(N * (C + K)));
  if (config.aux_loss_coef != 0.0f) {
    t.hold<float>(N * E);  // dprobs
    t.scratch(bytes<int64_t>(E) + bytes<float>(E));
  }
  t.hold<float>(N * E);  // drouter
  t.scratch(router_backward_scratch(N, E));
  t.release(moe_mark);
  t.scratch(rmsnorm_backward_scratch(N, int(C)));
  t.hold<float>(N * A);                              // datt
  for (int i = 0; i < 3; ++i) t.hold<float>(N * A);  // dq, dk, dv
  t.scratch(attention_backward_scratch(batch, H, D));
  t.hold<float>(N * A);  // dq_pre
  t.hold<float>(N * A);  // dk_pre
  t.scratch(rope_scratch(std::min<int64_t>(N, batch.longest), D));
  t.hold<float>(N * C);  // dxn1
  t.scratch(rmsnorm_backward_scratch(N, int(C)));
  t.release(layer_mark);
}

// Transformer::forward: the batch layout, tokens and positions, then every layer's activations
// and its output residual, kept for backward, then the head.
void hold_forward(Tally& t, const ModelConfig& config, const ParameterLayout& layout,
                  const RoutedShare& share, const PackedBatch& inputs) {
  const int64_t N = inputs.tokens, C = config.d_model;
  t.hold<int>(inputs.sequences + 1);
  t.hold<int>(N);
  t.hold<int>(N);
  t.hold<float>(N * C);
  for (int l = 0; l < config.n_layers; ++l) {
    hold_layer(t, config, layout, share, N);
    t.hold<float>(N * C);
    layer_forward(t, config, layout, share, N, &inputs, 0);
  }
  hold_head(t, config, N);
}

}  // namespace

PackedBatch packed_batch(const std::vector<int>& lengths) {
  PackedBatch b;
  b.lengths = lengths;
  b.sequences = int(lengths.size());
  for (int length : lengths) {
    b.tokens += length;
    b.query_blocks += blocks(length, kAttentionBlock);
    b.longest = std::max(b.longest, length);
  }
  return b;
}

PackedBatch uniform_batch(int sequences, int length) {
  return packed_batch(std::vector<int>(size_t(std::max(sequences, 0)), length));
}

namespace {

// Transformer::allocate_kv_cache: keys and values of every layer the layout stores, every slot at
// max_len (with tensor parallelism of the rank's heads).
void hold_kv_cache(Tally& t, const ModelConfig& config, const ParameterLayout& layout,
                   int64_t slots, int max_len) {
  for (int l = 0; l < config.n_layers; ++l) {
    if (!layout.stores_layer(l)) continue;
    for (int kv = 0; kv < 2; ++kv) t.hold<float>(slots * max_len * layout.attention_width());
  }
}

}  // namespace

namespace {

// Transformer::prefill(_range) over `prompts`: each prompt token's position and cache slot, the
// pass, the last token of each prompt, its logits; then the sampling of the first tokens.
void hold_prefill(Tally& t, const ModelConfig& config, const ParameterLayout& layout,
                  const RoutedShare& share, const PackedBatch& prompts, bool sampled) {
  t.hold<int>(prompts.tokens);
  t.hold<int>(prompts.tokens);
  inference_pass(t, config, layout, share, prompts.tokens, &prompts, 0);
  t.hold<float>(prompts.sequences * config.d_model);
  hold_head(t, config, prompts.sequences);
  t.scratch(sampling_scratch(prompts.sequences, config.vocab_size, sampled));
}

// A decode step of `rows` rows, each attending to at most `max_len` positions: the pass, the
// logits and the sampling.
void hold_decode_step(Tally& t, const ModelConfig& config, const ParameterLayout& layout,
                      const RoutedShare& share, int64_t rows, int max_len, bool sampled) {
  inference_pass(t, config, layout, share, rows, nullptr, max_len);
  hold_head(t, config, rows);
  t.scratch(sampling_scratch(rows, config.vocab_size, sampled));
}

}  // namespace

size_t pipeline_generation_peak_bytes(const ModelConfig& config, const ParameterLayout& layout,
                                      const PackedBatch& prefill_piece, int group_sequences,
                                      int cache_slots, int max_len, bool sampled,
                                      bool expert_token_split) {
  const int64_t C = config.d_model;
  const RoutedShare share = routed_share(layout, expert_token_split);
  Tally t;
  hold_kv_cache(t, config, layout, cache_slots, max_len);
  const size_t after_cache = t.mark();
  // A prefill piece: the hidden rows received (or the packed tokens on the first stage), then the
  // prefill and on the last stage the sampling.
  t.hold<float>(prefill_piece.tokens * C);
  hold_prefill(t, config, layout, share, prefill_piece, sampled);
  // A decode step of the group, every row running, on the hidden rows received.
  t.release(after_cache);
  t.hold<float>(int64_t(group_sequences) * C);
  hold_decode_step(t, config, layout, share, group_sequences, max_len, sampled);
  return t.peak();
}

size_t generation_peak_bytes(const ModelConfig& config, const ParameterLayout& layout,
                             const PackedBatch& prompts, int max_len, bool sampled,
                             bool expert_token_split) {
  const int64_t B = prompts.sequences;
  const RoutedShare share = routed_share(layout, expert_token_split);
  Tally t;
  hold_kv_cache(t, config, layout, B, max_len);
  const size_t after_cache = t.mark();
  hold_prefill(t, config, layout, share, prompts, sampled);
  // generate() rewinds to after the cache before each decode step; the largest has every sample
  // active, each attending to at most max_len positions.
  t.release(after_cache);
  hold_decode_step(t, config, layout, share, B, max_len, sampled);
  return t.peak();
}

size_t forward_peak_bytes(const ModelConfig& config, const ParameterLayout& layout,
                          const PackedBatch& inputs) {
  Tally t;
  hold_forward(t, config, layout, RoutedShare{}, inputs);
  return t.peak();
}

size_t training_micro_batch_peak_bytes(const ModelConfig& config, const ParameterLayout& layout,
                                       const PackedBatch& inputs, bool expert_token_split) {
  const int64_t N = inputs.tokens, C = config.d_model, V = config.vocab_size;
  const RoutedShare share = routed_share(layout, expert_token_split);
  Tally t;
  hold_forward(t, config, layout, share, inputs);
  // accumulate_policy_gradient (src/rl/policy_loss.cpp): tempered logits, log-probs and their
  // normalizers, the loss's gradient at the log-probs and at the logits.
  t.hold<float>(N * V);
  for (int i = 0; i < 3; ++i) t.hold<float>(N);
  t.hold<float>(N * V);
  // Transformer::backward: the final norm's input gradients, then the layers from the last; the
  // first one backward already sits on every saved activation, and the others reuse its memory.
  t.hold<float>(N * C);
  t.hold<float>(N * C);
  t.scratch(rmsnorm_backward_scratch(N, int(C)));
  layer_backward(t, config, layout, share, inputs);
  return t.peak();
}

size_t pipeline_chunk_peak_bytes(const ModelConfig& config, const ParameterLayout& layout,
                                 const PackedBatch& inputs, int first, int last,
                                 bool expert_token_split) {
  const int64_t N = inputs.tokens, C = config.d_model, V = config.vocab_size;
  const RoutedShare share = routed_share(layout, expert_token_split);
  Tally t;
  // Transformer::forward_range_pass: the batch layout, the tokens when it embeds, positions; run:
  // the residual stream in, then every layer's activations and output residual, kept.
  t.hold<int>(inputs.sequences + 1);
  if (first == 0) t.hold<int>(N);
  t.hold<int>(N);
  t.hold<float>(N * C);
  for (int l = first; l < last; ++l) {
    hold_layer(t, config, layout, share, N);
    t.hold<float>(N * C);
    layer_forward(t, config, layout, share, N, &inputs, 0);
  }
  const bool ends_model = last == config.n_layers;
  if (ends_model) {
    hold_head(t, config, N);
    // PipelineStage: the loss's gradient at the logits; policy_loss_gradient: tempered logits,
    // log-probs, their normalizers and the loss's gradient at them (all kept to the backward).
    t.hold<float>(N * V);
    t.hold<float>(N * V);
    for (int i = 0; i < 3; ++i) t.hold<float>(N);
  }
  // Transformer::backward_layers: the gradient of the residual stream (with the head, of the
  // final norm's output too), then the layers from the last.
  t.hold<float>(N * C);
  if (ends_model) {
    t.hold<float>(N * C);
    t.scratch(rmsnorm_backward_scratch(N, int(C)));
  }
  if (last > first) layer_backward(t, config, layout, share, inputs);
  return t.peak();
}

}  // namespace rlf
