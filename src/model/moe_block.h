// The mixture-of-experts feed-forward block of one layer: top-k router (+ load-balancing loss),
// tokens grouped by expert in canonical order, grouped SwiGLU experts, weighted combine, and an
// optional shared expert every token passes through. With expert parallelism (an
// ExpertDispatcher for the layer) the gather/combine in the middle become the dispatcher's
// All-to-All(v) dispatch/combine and only this rank's local experts run; router, load-balancing
// loss and shared expert stay on the rank's own tokens.
#pragma once

#include <memory>

#include "kernels/ops.h"
#include "src/model/expert_table.h"
#include "src/model/model_config.h"
#include "src/model/parameter_layout.h"
#include "src/model/resumable_pass.h"

namespace rlf {

class Arena;
class ExpertDispatcher;
class OverlappedExperts;
class TensorParallel;
struct RowShare;

template <typename T>
struct MoeWeights {
  T* router;               // [E, C]
  T* const* w1;            // one pointer per stored expert to its [F, C] (ExpertTable)
  T* const* w3;            // [F, C] each
  T* const* w2;            // [C, F] each
  T* shared_w1 = nullptr;  // [S, C]; null without a shared expert
  T* shared_w3 = nullptr;  // [S, C]
  T* shared_w2 = nullptr;  // [C, S]
  int first_expert = 0;    // w1/w3/w2 start at this expert (an expert-sharded layout)
};

// Layer `layer`'s MoE tensors: the router and shared expert inside a flat buffer laid out by
// `layout`, the routed experts where `experts` points (parameters or gradients alike). Valid while
// `experts` lives.
template <typename T>
MoeWeights<T> moe_weights(const ParameterLayout& layout, T* base, const ExpertTable<T>& experts,
                          int layer);
// The same with the layer's offsets given (`base` + o.router, ...).
template <typename T>
MoeWeights<T> moe_weights(const LayerOffsets& o, T* base, const ExpertTable<T>& experts, int layer);

// What forward saves for backward (pointers into the device arena). With expert parallelism the
// routed-expert buffers (xg, ffn_a, ffn_b, y, expert_offsets) hold this rank's dispatched rows and
// are allocated by forward once their count is known; row_of_assignment and token_of_row stay
// null (the dispatcher keeps the routing plan).
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
      : config_(config), ops_(ops), device_(device), shared_width_(config.shared_expert_d_ff) {}

  // Tensor parallelism that cuts the shared expert (src/model/tensor_parallel.h): its w1/w3/w2 are
  // this rank's `shared_width` hidden units, and its output in forward and its input gradient in
  // backward are summed over `tp`'s group (collective). Not owned.
  void set_tensor_parallel(const TensorParallel* tp, int shared_width) {
    tp_ = tp;
    shared_width_ = shared_width;
  }

  // The token split of tensor x expert parallelism (Megatron's): with a dispatcher, each rank
  // of `tp`'s group (whose ranks bring the same rows) dispatches only its share of them
  // (tp->row_share(N)) over its EP group, and the combined rows are allgathered over the TP group,
  // so every routed expert computes each of the group's tokens once instead of on every TP rank.
  // The router still runs on every row on every rank: the load-balancing loss, the router's
  // gradient and the input gradient stay those of the group's tokens, bit-identical on every TP
  // rank, at the cost of the small router matmul. In backward each rank backpropagates its rows
  // through combine, experts and dispatch, and one allgather brings every row's input gradient
  // and top-k weight gradient. Expert gradients then cover only this rank's rows: the caller sums
  // them over the TP group (sum_expert_gradients_over_tensor_group, or with EP
  // reduce_tensor_expert_gradients). Without a dispatcher (TP alone) the same split runs on this
  // rank's own experts: each TP rank computes its share of the rows' routed experts instead of all
  // of them. Null: off. Not owned.
  void set_token_split(const TensorParallel* tp) { token_split_ = tp; }
  const TensorParallel* token_split() const { return token_split_; }
  // Routed rows (token x top-k assignments) this rank's own experts computed without a
  // dispatcher (forward passes only; with the token split its share's), since construction of
  // this block or of the one whose count it shares (share_row_count: a model's views count into
  // the model's).
  int64_t local_routed_rows() const { return *routed_rows_; }
  // The rows of N whose routed experts this rank computes: all, or with the token split its TP
  // rank's share.
  RowShare own_rows(int N) const;
  void share_row_count(const MoeBlock& other) { routed_rows_ = other.routed_rows_; }

  // `expert_parallel`: whether forward will get a dispatcher (its routed buffers are then
  // allocated by forward).
  MoeActivations<T> allocate(int N, bool expert_parallel = false) const;
  // out[N, C] = routed experts (+ shared expert) applied to x[N, C]. With `ep` (collective over
  // its EP group; float only) the routed experts are the dispatcher's: w.w1/w3/w2 may still point
  // at all E experts and only ep->ep_rank()'s local experts are read. `ep` keeps the
  // routing plan that backward needs, so every layer needs its own dispatcher.
  // With `overlap` (same EP group and experts as `ep`) the routed experts run chunked with their
  // transfers overlapped (src/model/overlapped_experts.h); backward must then get it too.
  // A resumable pass: with `ep` it stops at the dispatch and at the combine until they complete
  // (src/model/resumable_pass.h); run_to_end runs it as the blocking call.
  ResumablePass forward(MoeWeights<T> w, const T* x, T* out, int N, MoeActivations<T>& a,
                        ExpertDispatcher* ep = nullptr, OverlappedExperts* overlap = nullptr) const;
  // Adds into dx[N, C] and the gradients `g` (same layout as the weights) given dout[N, C];
  // aux_weight scales the load-balancing loss's gradient. With `ep` (the one forward used, with
  // no dispatch since) only the local experts' gradients are written. Resumable like forward: it
  // stops at combine_backward and dispatch_backward.
  ResumablePass backward(MoeWeights<T> w, MoeWeights<T> g, const T* x, const MoeActivations<T>& a,
                         const T* dout, T* dx, int N, T aux_weight, ExpertDispatcher* ep = nullptr,
                         OverlappedExperts* overlap = nullptr) const;

 private:
  // The routed experts of forward/backward through the dispatcher (T = float only).
  ResumablePass routed_forward_ep(MoeWeights<T> w, const T* x, T* out, int N, MoeActivations<T>& a,
                                  ExpertDispatcher& ep) const;
  ResumablePass routed_backward_ep(MoeWeights<T> w, MoeWeights<T> g, const MoeActivations<T>& a,
                                   const T* dout, T* dx, T* dweight, int N,
                                   ExpertDispatcher& ep) const;
  // The same through OverlappedExperts (T = float only); with the token split on this rank's
  // share of the rows, like the dispatcher's path.
  ResumablePass routed_forward_overlapped(MoeWeights<T> w, const T* x, T* out, int N,
                                          const MoeActivations<T>& a,
                                          OverlappedExperts& overlap) const;
  ResumablePass routed_backward_overlapped(MoeWeights<T> w, MoeWeights<T> g, const T* dout, T* dx,
                                           T* dweight, int N, OverlappedExperts& overlap) const;
  // The routed experts of forward/backward on this rank without a dispatcher: every row, or with
  // the token split this rank's share (then allgathered over the TP group; float only).
  void routed_forward_local(MoeWeights<T> w, const T* x, T* out, int N, MoeActivations<T>& a) const;
  void routed_backward_local(MoeWeights<T> w, MoeWeights<T> g, const MoeActivations<T>& a,
                             const T* dout, T* dx, T* dweight, int N) const;
  // The token split's end of a routed backward: this rank's rows' input gradients (`dx_rows`,
  // own.count x C) and top-k weight gradients (`dweight_rows`, own.count x K) go to every rank of
  // the TP group in one allgather of rows of C + K floats; dx gets all N rows added, dweight all
  // N rows written.
  void gather_split_backward(RowShare own, const float* dx_rows, const float* dweight_rows, int N,
                             float* dx, float* dweight) const;

  const ModelConfig& config_;
  const Ops<T>& ops_;
  Arena& device_;
  const TensorParallel* tp_ = nullptr;
  const TensorParallel* token_split_ = nullptr;
  int shared_width_;  // the shared expert's hidden units on this rank
  std::shared_ptr<int64_t> routed_rows_ = std::make_shared<int64_t>(0);  // local_routed_rows()
};

}  // namespace rlf
