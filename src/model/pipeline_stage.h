// One rank's part of a pipeline-parallel model: the layers of its chunks (ranges of consecutive
// layers; which ones is the schedule's business, src/runtime/pipeline_schedule.h), the embedding
// where a chunk starts at layer 0, the final norm, head and loss where one ends at the last
// layer; one copy of their parameters and
// gradients (no parameter is stored on two ranks, however many chunks a rank holds), and the
// activations of every micro-batch chunk in flight, each in an arena of its own so that one is
// freed the moment its backward ends, in whatever order the schedule runs them.
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "kernels/arena.h"
#include "kernels/ops.h"
#include "src/model/model_config.h"
#include "src/model/parameter_layout.h"
#include "src/model/transformer.h"

namespace rlf {

// A micro-batch of packed sequences and its loss: sum_n weights[n] * -log p(targets[n]) (or the
// stage's own loss function). aux_scale scales the step's router loss weight for this micro-batch
// (RL weighs each micro-batch's load-balancing loss by its share of the step's samples).
template <typename T>
struct PipelineMicroBatch {
  std::vector<int> tokens, seq_offsets{0}, targets;
  std::vector<T> weights;
  T aux_scale = T(1);
  int sequences() const { return int(seq_offsets.size()) - 1; }
  int token_count() const { return seq_offsets.back(); }
};

// Layers [first, last).
struct LayerRange {
  int first = 0, last = 0;
};

// What a stage with these chunks stores: their layers, the embedding if one starts at layer 0,
// the final norm and head if one ends at layer n_layers.
LayerShard stage_layer_shard(const std::vector<LayerRange>& chunks, int n_layers);

// What a stage storing `stored` (some layers, not all) does not: the other stages' layers, and the
// embedding and head where it lacks them (what it borrows to generate from every layer).
LayerShard other_stages_layer_shard(const LayerShard& stored, int n_layers);

// The loss of the chunk that ends the model on micro-batch `index`: from its `logits` [N, V] (in
// `arena`, which the function may allocate from until the chunk's backward), writes d(loss) /
// d(logits) into `dlogits` (zeroed) and returns the loss.
template <typename T>
using PipelineLoss =
    std::function<T(int index, const T* logits, int N, int V, Arena& arena, T* dlogits)>;

template <typename T>
class PipelineStage {
 public:
  // `chunks`: the rank's chunks in its local order (non-empty, disjoint ranges). Parameters and
  // gradients in `device`; every micro-batch chunk in flight gets an arena of `activation_bytes`
  // (reserved, not touched, until used). Throws std::invalid_argument on bad ranges.
  PipelineStage(const ModelConfig& config, const Ops<T>& ops, Arena& device,
                std::vector<LayerRange> chunks, size_t activation_bytes);
  // Over a model built elsewhere with the layout of the chunks
  // (stage_layer_shard; with tensor parallelism, its TP slice of them; with expert parallelism,
  // its experts); it must outlive the stage. std::invalid_argument when the layout differs. A
  // model without gradients makes a forward-only stage (forward and release, no backward).
  PipelineStage(Transformer<T>& model, std::vector<LayerRange> chunks, size_t activation_bytes);

  // With expert parallelism: `per_slot(slot)` gives the per-layer dispatchers of activation arena
  // `slot`'s model view, asked once per arena when it is made (before its first forward). A
  // dispatcher keeps the plan of its last dispatch for the backward, so every micro-batch chunk in
  // flight needs dispatchers of its own. Making them is collective over the EP group: its ranks
  // run the same schedule, so they make their arenas at the same passes.
  using ExpertDispatchers = std::function<std::vector<ExpertDispatcher*>(int slot)>;
  void set_expert_dispatchers(ExpertDispatchers per_slot) { dispatchers_ = std::move(per_slot); }
  // With expert parallelism and overlap chunks: `per_slot(slot, arena)` gives the per-layer
  // OverlappedExperts of activation arena `slot`'s view (its FFN work buffers in `arena`), asked
  // once per arena right after its dispatchers: every MoE layer of every micro-batch chunk then
  // runs its routed experts in chunks whose dispatch and combine overlap the expert FFN, each
  // view with its own (they keep the chunks' plans and rows for the backward). Collective over
  // the EP group, like the dispatchers.
  using ExpertOverlap = std::function<std::vector<OverlappedExperts*>(int slot, Arena& arena)>;
  void set_expert_overlap(ExpertOverlap per_slot) { overlap_ = std::move(per_slot); }

  Transformer<T>& model() { return model_; }
  // Replaces the weighted NLL of the micro-batches by `loss` (empty: back to the weighted NLL).
  void set_loss(PipelineLoss<T> loss) { loss_function_ = std::move(loss); }
  int chunks() const { return int(chunks_.size()); }
  const LayerRange& chunk(int k) const { return chunks_[size_t(k)]; }
  bool embeds(int k) const { return chunk(k).first == 0; }
  bool ends_model(int k) const { return chunk(k).last == config_.n_layers; }

  // Forward of `chunk` on micro-batch `index`: from the batch's tokens when the chunk embeds,
  // else from `x_in` [N, d_model]. Returns the hidden rows for the next chunk of the model,
  // valid until this chunk's backward; a chunk that ends the model computes the loss and its
  // gradient instead (kept for the backward) and returns null.
  const T* forward(int index, int chunk, const PipelineMicroBatch<T>& batch, const T* x_in);
  // Backward of `chunk` on micro-batch `index` from `dy`, the gradient of its forward's result
  // (ignored when the chunk ends the model: the loss's own); writes the gradient of x_in into
  // `dx_in` (unless the chunk embeds). Gradients add up in model().gradients().
  void backward(int index, int chunk, const T* dy, T aux_weight, T* dx_in);
  // The same two as resumable passes that stop at every expert-parallel exchange
  // (src/model/resumable_pass.h), for running a forward and a backward as a pair
  // (src/model/pass_pair.h); forward_pass sets `*result` when it ends. Each takes or frees its
  // activation arena where forward and backward do (at its start, at its end), so a pair run in
  // list order makes the arenas, and their collective dispatchers, at the same passes.
  ResumablePass forward_pass(int index, int chunk, const PipelineMicroBatch<T>& batch,
                             const T* x_in, const T** result);
  ResumablePass backward_pass(int index, int chunk, const T* dy, T aux_weight, T* dx_in);

  // Ends micro-batch `index`'s `chunk` without a backward (a forward-only pass): its activations
  // and arena are freed, so the result of its forward is no longer valid.
  void release(int index, int chunk);

  // Summed over the forwards since reset_losses(): the weighted NLL of the chunk that ends the
  // model, and the router load-balancing loss of every chunk's layers (times each micro-batch's
  // aux_scale, not the step's weight).
  T loss() const { return loss_; }
  T aux_loss() const { return aux_loss_; }
  void reset_losses() { loss_ = aux_loss_ = T(0); }

  // Arenas made so far: the most micro-batch chunks that were in flight at once.
  int activation_arenas() const { return int(arenas_.size()); }
  // Arena `slot` (< activation_arenas()): memory of the kind of the model's device arena (CUDA
  // managed memory on a GPU, where the kernels read and write it).
  const Arena& activation_arena(int slot) const { return *arenas_.at(size_t(slot)); }
  // The largest use of any of them.
  size_t activation_peak() const;

 private:
  struct InFlight {
    int slot;
    T* dlogits;  // last virtual stage: the loss's gradient
  };

  int take_slot();

  ModelConfig config_;
  std::vector<LayerRange> chunks_;
  size_t activation_bytes_;
  std::unique_ptr<Transformer<T>> owned_model_;  // null when the model was built elsewhere
  Transformer<T>& model_;
  PipelineLoss<T> loss_function_;
  ExpertDispatchers dispatchers_;
  ExpertOverlap overlap_;
  std::vector<std::unique_ptr<Arena>> arenas_;
  std::vector<std::unique_ptr<Transformer<T>>> views_;  // one per arena, over model_'s weights
  std::vector<int> free_slots_;
  std::map<std::pair<int, int>, InFlight> in_flight_;  // (micro-batch, chunk)
  T loss_ = T(0), aux_loss_ = T(0);
};

}  // namespace rlf
