// Where each routed expert of a model lives: per layer, one pointer per stored expert to its
// w1 [F, C], w3 [F, C] and w2 [C, F]. The grouped expert kernels read experts through these
// pointers (kernels/moe.h), so an expert may be rows of a flat parameter buffer (the tensors of a
// ParameterLayout) or a fixed-size bucket w1 | w3 | w2 anywhere in the device arena (a slot of
// kernels/slot_pool.h): RL Fusion's generation view runs the experts a rank holds for training
// where they are and the ones it received in slots, with no copy (src/runtime/layout_switch.h).
#pragma once

#include <cstdint>
#include <vector>

#include "src/model/model_config.h"
#include "src/model/parameter_layout.h"

namespace rlf {

// Elements of one expert's bucket w1 | w3 | w2: 3 F C.
int64_t expert_bucket_elements(const ModelConfig& config);
// Buckets (layer, expert) of `wanted`'s experts on `layers` layers that `held` lacks: what a
// layout switch from a rank holding `held` to one running `wanted` receives.
int expert_buckets_missing(ExpertShard held, ExpertShard wanted, int layers);
// The most such buckets when the held experts can be any `held_count` of the `experts` (a
// training placement after expert migration): per layer, as many of `wanted`'s as fit outside.
int expert_buckets_missing_any_placement(int held_count, ExpertShard wanted, int experts,
                                         int layers);

template <typename T>
class ExpertTable {
 public:
  ExpertTable() = default;
  // The experts `layout` stores, inside the flat buffer `base` laid out by it (parameters,
  // gradients or a moment).
  ExpertTable(const ParameterLayout& layout, T* base);
  // `layers` layers of experts `shard` (count >= 1), every pointer null until set.
  ExpertTable(int layers, ExpertShard shard);

  int layers() const { return int(w1_.size()); }
  // The routed experts the table addresses (global ids).
  ExpertShard shard() const { return shard_; }
  // Expert `expert` (a global id inside shard()) of `layer` at these three matrices.
  void set(int layer, int expert, T* w1, T* w3, T* w2);
  // ... at one bucket of expert_bucket_elements(): w1 [F, C], then w3 [F, C], then w2 [C, F].
  void set_bucket(int layer, int expert, T* bucket, int F, int C);
  // Whether every expert of every layer has its pointers.
  bool complete() const;

  // shard().count pointers each, expert shard().first first.
  T* const* w1(int layer) const { return w1_[size_t(layer)].data(); }
  T* const* w3(int layer) const { return w3_[size_t(layer)].data(); }
  T* const* w2(int layer) const { return w2_[size_t(layer)].data(); }

 private:
  size_t index(int layer, int expert) const;  // std::out_of_range outside the table

  ExpertShard shard_{0, 0};
  std::vector<std::vector<T*>> w1_, w3_, w2_;
};

}  // namespace rlf
