// Where every named parameter tensor lives inside one flat buffer. The same layout indexes the
// parameters, their gradients and the optimizer moments, so a flat buffer can be moved, reduced,
// offloaded or checkpointed as one piece (and later, in buckets).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "src/model/model_config.h"

namespace rlf {

struct ParameterTensor {
  std::string name;            // e.g. "layers.0.experts.w1"
  std::vector<int64_t> shape;  // row-major
  int64_t offset = 0;          // in elements from the start of the flat buffer
  int64_t numel = 0;
  bool is_norm_weight = false;  // initialized to 1, not random
  int64_t source_offset = 0;    // index of its first element in the unsharded tensor
  // A routed-expert tensor: shape[0] counts the experts the layout stores (its rows are experts
  // first_expert() ...), so expert parallelism shards it along that dimension.
  bool routed_expert = false;
  // Its index in the list of the layout that stores every layer: the stream of its
  // initialization, so a pipeline stage's tensors get exactly the whole model's values.
  int64_t source_index = 0;
  // Tensor parallelism (TensorSlice): how this rank's tensor is cut from the unsharded one.
  // None: whole (replicated over the TP group). Rows: a block of rows (output features: Q/K/V,
  // shared w1/w3, column-parallel), contiguous in the unsharded tensor. Columns: a block of
  // columns (input features: attention wo, shared w2, row-parallel); its rows are
  // source_row_length apart in the unsharded tensor.
  enum class TensorSplit { None, Rows, Columns } tp_split = TensorSplit::None;
  int64_t source_row_length = 0;  // Columns: the unsharded tensor's row length

  // Index in the unsharded tensor of this tensor's element i.
  int64_t source_element(int64_t i) const {
    if (tp_split != TensorSplit::Columns) return source_offset + i;
    const int64_t width = shape.back();
    return source_offset + (i / width) * source_row_length + i % width;
  }
};

// One tensor's slice: `slice` (t.numel elements, laid out as t) from `whole_tensor`, the unsharded
// tensor's elements (element i from whole_tensor[t.source_element(i)]), row by row. Pure.
template <typename T>
void slice_tensor(const ParameterTensor& t, const T* whole_tensor, T* slice);

// Which routed experts a layout stores: [first, first + count). count < 0: all of them. Expert
// parallelism gives each rank of an EP group only its own experts, so a rank's buffers (weights,
// gradients, optimizer moments) hold no copy of another rank's experts.
// With `redundant` > 0 (an EP learner with replicas of hot experts, docs/EDPB.md) the layout
// stores expert *slots* instead: EP rank r = first / count holds slots [r (count + redundant),
// (r + 1) (count + redundant)) of the dispatcher's slot space, its first `count` rows its own
// experts [first, first + count), the `redundant` spare rows whatever replicas the slot table
// puts there (zero after initialize_parameters, until RoleExpertParallel fills them).
struct ExpertShard {
  int first = 0;
  int count = -1;
  int redundant = 0;
};

// Which layers a layout stores: pipeline parallelism gives each stage only its layers (and the
// embedding to the first stage, the final norm and LM head to the last), so no parameter is
// stored on two stages. The default stores everything.
struct LayerShard {
  std::vector<int> layers;  // layer indices stored; empty: all of them
  bool embedding = true;
  bool head = true;  // final norm and LM head
  bool stores_layer(int layer) const;
};

// Which slice of the tensor-parallel tensors a layout stores (Megatron-style, for TP group rank
// `rank` of `size`): attention heads [rank H / size, (rank + 1) H / size) (rows of wq, wk, wv;
// columns of wo) and, unless attention_only, the shared expert's hidden units
// [rank S / size, (rank + 1) S / size) (rows of shared w1, w3; columns of shared w2). Every other
// tensor is whole. size 1: the unsharded layout. validate_tensor_parallel
// (src/model/tensor_parallel.h) checks that size divides what it cuts.
struct TensorSlice {
  int rank = 0;
  int size = 1;
  bool attention_only = false;
  bool active() const { return size > 1; }
  bool splits_shared_expert() const { return size > 1 && !attention_only; }
};

// A contiguous piece of the flat buffer, in elements.
struct ParameterRange {
  int64_t offset = 0;
  int64_t count = 0;
};

// Offsets of one transformer layer's tensors (element offsets into the flat buffer); -1 for a
// layer the layout does not store.
struct LayerOffsets {
  int64_t attn_norm, wq, wk, wv, wo, ffn_norm, router, w1, w3, w2;
  int64_t shared_w1 = -1, shared_w3 = -1, shared_w2 = -1;  // -1: no shared expert
};

class ParameterLayout {
 public:
  // Throws std::invalid_argument when the shard is not a non-empty range of the config's experts,
  // a stored layer is not one of the config's, or the tensor slice does not divide the heads (or
  // the shared expert's width). Tensors keep their whole-model names.
  explicit ParameterLayout(const ModelConfig& config, ExpertShard shard = {},
                           LayerShard layers = {}, TensorSlice tensor_slice = {});

  const std::vector<ParameterTensor>& tensors() const { return tensors_; }
  int64_t total() const { return total_; }
  int64_t embedding() const { return embedding_; }
  int64_t final_norm() const { return final_norm_; }
  int64_t lm_head() const { return lm_head_; }
  const LayerOffsets& layer(int index) const { return layers_[size_t(index)]; }
  // Embedding, final norm and head offsets are -1 when not stored (pipeline stages).
  bool stores_layer(int index) const { return layers_[size_t(index)].wq >= 0; }
  bool stores_embedding() const { return embedding_ >= 0; }
  bool stores_head() const { return lm_head_ >= 0; }
  const ParameterTensor* find(const std::string& name) const;
  // The routed experts stored: [first_expert(), first_expert() + stored_experts()), the rows of
  // every routed-expert tensor. With redundant slots these are slot ids (ExpertShard).
  int first_expert() const { return first_expert_; }
  int stored_experts() const { return stored_experts_; }
  // Spare slots per rank (0: the rows are expert ids) and the experts the first rows hold:
  // [own_experts().first, + own_experts().count) in rows 0, 1, ...
  int redundant_slots() const { return redundant_slots_; }
  ExpertShard own_experts() const { return {own_first_, own_count_}; }
  // The shard that gives this layout's routed-expert rows (its slots, with redundant ones):
  // another layout of the same experts (a TP slice of this one) is built from it.
  ExpertShard stored_expert_shard() const {
    return redundant_slots_ > 0 ? ExpertShard{own_first_, own_count_, redundant_slots_}
                                : ExpertShard{first_expert_, stored_experts_};
  }
  bool expert_sharded() const { return sharded_; }
  // The tensor-parallel slice stored, and the widths it gives one rank: attention heads, their
  // width (heads x head_dim: the columns of Q, K, V and the KV cache), the shared expert's hidden
  // units.
  const TensorSlice& tensor_slice() const { return tensor_slice_; }
  // The layers stored (as given: empty layers = all of them).
  const LayerShard& layer_shard() const { return layer_shard_; }
  int local_heads() const { return local_heads_; }
  int attention_width() const { return attention_width_; }
  int shared_width() const { return shared_width_; }

 private:
  // Adds a tensor, or, while storing_ is false, only counts it (returns -1).
  int64_t add(const std::string& name, std::vector<int64_t> shape, bool is_norm_weight = false,
              int64_t source_offset = 0);
  // The slice of the unsharded [rows, cols] tensor `name` that tensor_slice_ gives this rank:
  // `split` rows (Rows) or columns (Columns) of `parts` equal blocks, block tensor_slice_.rank.
  int64_t add_split(const std::string& name, int64_t rows, int64_t cols,
                    ParameterTensor::TensorSplit split);

  std::vector<ParameterTensor> tensors_;
  std::vector<LayerOffsets> layers_;
  int64_t total_ = 0;
  int64_t embedding_ = 0, final_norm_ = 0, lm_head_ = 0;
  int first_expert_ = 0, stored_experts_ = 0;
  int redundant_slots_ = 0, own_first_ = 0, own_count_ = 0;
  bool sharded_ = false;
  bool storing_ = true;
  int64_t next_source_index_ = 0;
  TensorSlice tensor_slice_;
  LayerShard layer_shard_;
  int local_heads_ = 0, attention_width_ = 0, shared_width_ = 0;
};

// Deterministic init from a seed: N(0, init_std) per element drawn from Philox keyed by
// (seed, tensor index, element of the unsharded tensor: ParameterTensor::source_index), so an
// expert shard or a tensor-parallel slice gets exactly the slice of the unsharded
// initialization; residual
// output projections (wo, w2) are scaled by 1/sqrt(2 * n_layers) as in GPT-2; norms are 1.
// True for the routed experts' tensors (w1, w3, w2 of every layer), which EP shards.
bool is_expert_tensor(const ParameterTensor& tensor);
// The layer a tensor belongs to ("layers.3.experts.w1" -> 3), -1 for none (embedding, head).
int tensor_layer(const ParameterTensor& tensor);
// Layers with routed-expert tensors in the layout.
int expert_layers(const ParameterLayout& layout);

template <typename T>
void initialize_parameters(T* params, const ParameterLayout& layout, const ModelConfig& config,
                           uint64_t seed);

}  // namespace rlf
