// The mixture-of-experts feed-forward block of one layer: top-k router (+ load-balancing loss),
// tokens grouped by expert in canonical order, grouped SwiGLU experts, weighted combine, and an
// optional shared expert every token passes through. Expert parallelism later replaces the
// gather/combine in the middle with dispatch/combine All-to-All; the rest stays.
#pragma once

#include "kernels/ops.h"
#include "src/model/model_config.h"
#include "src/model/parameter_layout.h"

namespace rlf {

class Arena;

template <typename T>
struct MoeWeights {
  T* router;               // [E, C]
  T* w1;                   // [E, F, C]
  T* w3;                   // [E, F, C]
  T* w2;                   // [E, C, F]
  T* shared_w1 = nullptr;  // [S, C]; null without a shared expert
  T* shared_w3 = nullptr;  // [S, C]
  T* shared_w2 = nullptr;  // [C, S]
};

// Layer `layer`'s MoE tensors inside a flat buffer laid out by `layout` (parameters or gradients).
template <typename T>
MoeWeights<T> moe_weights(const ParameterLayout& layout, T* base, int layer);

// What forward saves for backward (pointers into the device arena).
template <typename T>
struct MoeActivations {
  T *router_logits, *probs, *expert_weight, *xg, *ffn_a, *ffn_b, *y;
  int *expert_idx, *expert_offsets, *row_of_assignment, *token_of_row;
  T *shared_a = nullptr, *shared_b = nullptr, *shared_y = nullptr;
  int* shared_offsets = nullptr;
  T aux = T(0);  // router load-balancing loss of this forward
};

template <typename T>
class MoeBlock {
 public:
  MoeBlock(const ModelConfig& config, const Ops<T>& ops, Arena& device)
      : config_(config), ops_(ops), device_(device) {}

  MoeActivations<T> allocate(int N) const;
  // out[N, C] = routed experts (+ shared expert) applied to x[N, C].
  void forward(const MoeWeights<T>& w, const T* x, T* out, int N, MoeActivations<T>& a) const;
  // Adds into dx[N, C] and the gradients `g` (same layout as the weights) given dout[N, C];
  // aux_weight scales the load-balancing loss's gradient.
  void backward(const MoeWeights<T>& w, const MoeWeights<T>& g, const T* x,
                const MoeActivations<T>& a, const T* dout, T* dx, int N, T aux_weight) const;

 private:
  const ModelConfig& config_;
  const Ops<T>& ops_;
  Arena& device_;
};

}  // namespace rlf
