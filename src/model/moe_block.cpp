#include "src/model/moe_block.h"

#include <cstring>
#include <stdexcept>
#include <type_traits>
#include <vector>

#include "kernels/arena.h"
#include "kernels/moe.h"
#include "mpi_comm/expert_dispatch.h"
#include "src/model/expert_pieces.h"
#include "src/model/overlapped_experts.h"
#include "src/model/router_skew.h"
#include "src/model/tensor_parallel.h"

namespace rlf {

template <typename T>
MoeWeights<T> moe_weights(const ParameterLayout& layout, T* base, const ExpertTable<T>& experts,
                          int layer) {
  return moe_weights(layout.layer(layer), base, experts, layer);
}

template <typename T>
MoeWeights<T> moe_weights(const LayerOffsets& o, T* base, const ExpertTable<T>& experts,
                          int layer) {
  MoeWeights<T> w{base + o.router, experts.w1(layer), experts.w3(layer), experts.w2(layer)};
  w.first_expert = experts.shard().first;
  if (o.shared_w1 >= 0) {
    w.shared_w1 = base + o.shared_w1;
    w.shared_w3 = base + o.shared_w3;
    w.shared_w2 = base + o.shared_w2;
  }
  return w;
}

template MoeWeights<float> moe_weights<float>(const ParameterLayout&, float*,
                                              const ExpertTable<float>&, int);
template MoeWeights<double> moe_weights<double>(const ParameterLayout&, double*,
                                                const ExpertTable<double>&, int);
template MoeWeights<float> moe_weights<float>(const LayerOffsets&, float*,
                                              const ExpertTable<float>&, int);
template MoeWeights<double> moe_weights<double>(const LayerOffsets&, double*,
                                                const ExpertTable<double>&, int);

template <typename T>
RowShare MoeBlock<T>::own_rows(int N) const {
  return token_split_ ? token_split_->row_share(N) : RowShare{0, N};
}

template <typename T>
MoeActivations<T> MoeBlock<T>::allocate(int N, bool expert_parallel) const {
  const int64_t C = config_.d_model, E = config_.n_experts, K = config_.top_k, F = config_.d_ff;
  const int64_t M = int64_t(N) * K;
  Arena& d = device_;
  MoeActivations<T> a;
  a.router_logits = d.allocate<T>(N * E, "activations");
  a.probs = d.allocate<T>(N * E, "activations");
  a.expert_weight = d.allocate<T>(M, "activations");
  a.expert_idx = d.allocate<int>(M, "activations");
  if (!expert_parallel) {
    // The routed rows this rank computes: with the token split only its share's.
    const int64_t R = int64_t(own_rows(N).count) * K;
    a.expert_offsets = d.allocate<int>(E + 1, "activations");
    a.row_of_assignment = d.allocate<int>(R, "activations");
    a.token_of_row = d.allocate<int>(R, "activations");
    a.xg = d.allocate<T>(R * C, "activations");
    a.ffn_a = d.allocate<T>(R * F, "activations");
    a.ffn_b = d.allocate<T>(R * F, "activations");
    a.y = d.allocate<T>(R * C, "activations");
  }
  if (config_.shared_expert_d_ff > 0) {
    const int64_t S = shared_width_;
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
ResumablePass MoeBlock<T>::forward(MoeWeights<T> w, const T* x, T* out, int N, MoeActivations<T>& a,
                                   ExpertDispatcher* ep, OverlappedExperts* overlap) const {
  const int C = config_.d_model, E = config_.n_experts, K = config_.top_k;
  ops_.matmul_forward(a.router_logits, x, w.router, N, C, E, device_);
  if (config_.router_skew != 0.0f) {
    add_router_bias(a.router_logits, router_skew_bias(E, config_.router_skew), N);
  }
  ops_.router_forward(a.expert_idx, a.expert_weight, a.probs, a.router_logits, N, E, K,
                      config_.normalize_topk, device_);
  // With EP this is the loss of this rank's tokens only: routing statistics are not additive
  // over ranks, so the EP model equals the single-rank one only when the coefficient is 0.
  a.aux = ops_.router_aux_loss_forward(a.probs, a.expert_idx, N, E, K, device_);
  if (overlap) {
    co_await routed_forward_overlapped(w, x, out, N, a, *overlap);
  } else if (ep) {
    co_await routed_forward_ep(w, x, out, N, a, *ep);
  } else {
    routed_forward_local(w, x, out, N, a);
  }
  if (a.shared_y) {
    // The shared expert is a dense SwiGLU: one "expert" owning all N rows.
    ops_.expert_ffn_forward(a.shared_y, a.shared_a, a.shared_b, x, &w.shared_w1, &w.shared_w3,
                            &w.shared_w2, a.shared_offsets, 1, C, shared_width_, device_);
    // Tensor parallelism: a partial sum over this rank's hidden units (row-parallel w2).
    if (tp_) tp_->allreduce_sum(a.shared_y, int64_t(N) * C);
    ops_.add(out, out, a.shared_y, int64_t(N) * C, device_);
  }
}

template <typename T>
ResumablePass MoeBlock<T>::backward(MoeWeights<T> w, MoeWeights<T> g, const T* x,
                                    const MoeActivations<T>& a, const T* dout, T* dx, int N,
                                    T aux_weight, ExpertDispatcher* ep,
                                    OverlappedExperts* overlap) const {
  const int C = config_.d_model, E = config_.n_experts, K = config_.top_k;
  const int64_t M = int64_t(N) * K;
  ArenaScope scope(device_);
  if (a.shared_y) {
    // Tensor parallelism: this rank's hidden units give a partial input gradient, summed over
    // the group (column-parallel w1/w3) before it joins the routed experts' (replicated) one.
    const int64_t NC = int64_t(N) * C;
    T* dx_shared = tp_ ? device_.allocate_zeroed<T>(NC, "backward work") : dx;
    ops_.expert_ffn_backward(dx_shared, &g.shared_w1, &g.shared_w3, &g.shared_w2, dout, x,
                             a.shared_a, a.shared_b, &w.shared_w1, &w.shared_w3, &w.shared_w2,
                             a.shared_offsets, 1, C, shared_width_, device_);
    if (tp_) {
      tp_->allreduce_sum(dx_shared, NC);
      ops_.add(dx, dx, dx_shared, NC, device_);
    }
  }
  T* dweight = device_.allocate_zeroed<T>(M, "backward work");
  if (overlap) {
    co_await routed_backward_overlapped(w, g, dout, dx, dweight, N, *overlap);
  } else if (ep) {
    co_await routed_backward_ep(w, g, a, dout, dx, dweight, N, *ep);
  } else {
    routed_backward_local(w, g, a, dout, dx, dweight, N);
  }
  T* dprobs = nullptr;
  if (aux_weight != T(0)) {
    dprobs = device_.allocate_zeroed<T>(int64_t(N) * E, "backward work");
    ops_.router_aux_loss_backward(dprobs, aux_weight, a.expert_idx, N, E, K, device_);
  }
  T* drouter = device_.allocate_zeroed<T>(int64_t(N) * E, "backward work");
  ops_.router_backward(drouter, dweight, dprobs, a.probs, a.expert_idx, a.expert_weight, N, E, K,
                       config_.normalize_topk, device_);
  ops_.matmul_backward(dx, g.router, drouter, x, w.router, N, C, E, device_);
}

template <typename T>
void MoeBlock<T>::routed_forward_local(MoeWeights<T> w, const T* x, T* out, int N,
                                       MoeActivations<T>& a) const {
  const int C = config_.d_model, E = config_.n_experts, K = config_.top_k, F = config_.d_ff;
  // With the token split this rank computes its share of the rows; the others come from its TP
  // mates in one allgather.
  const RowShare own = own_rows(N);
  const int64_t first = own.first;
  if (own.count > 0) {
    moe_build_routing(a.expert_offsets, a.row_of_assignment, a.token_of_row,
                      a.expert_idx + first * K, own.count, E, K);
    ops_.moe_gather(a.xg, x + first * C, a.token_of_row, own.count * K, C, device_);
    ops_.expert_ffn_forward(a.y, a.ffn_a, a.ffn_b, a.xg, w.w1, w.w3, w.w2, a.expert_offsets, E, C,
                            F, device_);
    ops_.moe_combine(out + first * C, a.y, a.expert_weight + first * K, a.row_of_assignment,
                     own.count, K, C, device_);
  }
  *routed_rows_ += int64_t(own.count) * K;
  if (!token_split_) return;
  if constexpr (std::is_same_v<T, float>) {
    token_split_->allgather_rows(out, N, C);
  } else {
    throw std::logic_error("MoeBlock: the expert token split needs float parameters");
  }
}

template <typename T>
void MoeBlock<T>::routed_backward_local(MoeWeights<T> w, MoeWeights<T> g,
                                        const MoeActivations<T>& a, const T* dout, T* dx,
                                        T* dweight, int N) const {
  const int C = config_.d_model, E = config_.n_experts, K = config_.top_k, F = config_.d_ff;
  const RowShare own = own_rows(N);
  const int64_t first = own.first, M = int64_t(own.count) * K;
  // (In backward's arena scope: the buffers live to its end, as the analytic peaks count them.)
  // With the token split this rank's rows' gradients go to buffers of their own, gathered below.
  T* dx_rows =
      token_split_ ? device_.allocate_zeroed<T>(int64_t(own.count) * C, "backward work") : dx;
  T* dweight_rows = token_split_ ? device_.allocate_zeroed<T>(M, "backward work") : dweight;
  if (own.count > 0) {
    T* dy = device_.allocate_zeroed<T>(M * C, "backward work");
    ops_.moe_combine_backward(dy, dweight_rows, dout + first * C, a.y, a.expert_weight + first * K,
                              a.row_of_assignment, own.count, K, C, device_);
    T* dxg = device_.allocate_zeroed<T>(M * C, "backward work");
    ops_.expert_ffn_backward(dxg, g.w1, g.w3, g.w2, dy, a.xg, a.ffn_a, a.ffn_b, w.w1, w.w3, w.w2,
                             a.expert_offsets, E, C, F, device_);
    ops_.moe_gather_backward(dx_rows, dxg, a.row_of_assignment, own.count, K, C, device_);
  }
  if (!token_split_) return;
  if constexpr (std::is_same_v<T, float>) {
    gather_split_backward(own, dx_rows, dweight_rows, N, dx, dweight);
  } else {
    throw std::logic_error("MoeBlock: the expert token split needs float parameters");
  }
}

template <typename T>
ResumablePass MoeBlock<T>::routed_forward_ep(MoeWeights<T> w, const T* x, T* out, int N,
                                             MoeActivations<T>& a, ExpertDispatcher& ep) const {
  if constexpr (!std::is_same_v<T, float>) {
    (void)w, (void)x, (void)out, (void)N, (void)a, (void)ep;
    throw std::logic_error("MoeBlock: expert parallelism needs float parameters");
    co_return;
  } else {
    const int C = config_.d_model, K = config_.top_k, F = config_.d_ff;
    if (ep.experts() != config_.n_experts) {
      throw std::logic_error("MoeBlock: the dispatcher's expert count differs from the model's");
    }
    // With the token split this rank dispatches only its share of the rows. The blocking
    // dispatch, begin and finish, with the pass stopped in between.
    const RowShare own = own_rows(N);
    ep.begin_dispatch(x + int64_t(own.first) * C, a.expert_idx + int64_t(own.first) * K, own.count,
                      K, C);
    co_await exchange(ep.chain());
    const std::vector<float> rows = ep.finish_dispatch();
    const int E_local = ep.local_experts(), R = ep.local_rows();
    // This rank's first expert, counted from the first expert the weights hold.
    const int64_t first = int64_t(ep.ep_rank()) * E_local - w.first_expert;
    Arena& d = device_;
    a.expert_offsets = d.allocate<int>(size_t(E_local) + 1, "activations");
    std::memcpy(a.expert_offsets, ep.local_expert_offsets().data(),
                (size_t(E_local) + 1) * sizeof(int));
    a.xg = d.allocate<float>(size_t(R) * C, "activations");
    if (R > 0) std::memcpy(a.xg, rows.data(), rows.size() * sizeof(float));
    a.ffn_a = d.allocate<float>(size_t(R) * F, "activations");
    a.ffn_b = d.allocate<float>(size_t(R) * F, "activations");
    a.y = d.allocate<float>(size_t(R) * C, "activations");
    // In pieces of whole experts, the bits of one call, a progress point after each (one piece
    // when nothing runs at the points).
    const int pieces = co_await pieces_wanted() ? kExpertPieces : 1;
    for (const ExpertRange& piece : expert_pieces(a.expert_offsets, E_local, pieces)) {
      expert_ffn_forward_piece(ops_, a.y, a.ffn_a, a.ffn_b, a.xg, w.w1 + first, w.w3 + first,
                               w.w2 + first, a.expert_offsets, piece, C, F, device_);
      co_await progress_point();
    }
    ep.begin_combine(a.y, a.expert_weight + int64_t(own.first) * K);
    co_await exchange(ep.chain());
    const std::vector<float> combined = ep.finish_combine();
    if (own.count > 0) {
      std::memcpy(out + int64_t(own.first) * C, combined.data(),
                  size_t(own.count) * C * sizeof(float));
    }
    if (token_split_) token_split_->allgather_rows(out, N, C);
  }
}

template <typename T>
ResumablePass MoeBlock<T>::routed_backward_ep(MoeWeights<T> w, MoeWeights<T> g,
                                              const MoeActivations<T>& a, const T* dout, T* dx,
                                              T* dweight, int N, ExpertDispatcher& ep) const {
  if constexpr (!std::is_same_v<T, float>) {
    (void)w, (void)g, (void)a, (void)dout, (void)dx, (void)dweight, (void)N, (void)ep;
    throw std::logic_error("MoeBlock: expert parallelism needs float parameters");
    co_return;
  } else {
    const int C = config_.d_model, F = config_.d_ff, K = config_.top_k;
    const int E_local = ep.local_experts(), R = a.expert_offsets[E_local];
    const RowShare own = own_rows(N);
    std::vector<float> dy_local, dweight_v;
    ep.begin_combine_backward(dout + int64_t(own.first) * C, a.y,
                              a.expert_weight + int64_t(own.first) * K);
    co_await exchange(ep.chain());
    ep.finish_combine_backward(dy_local, dweight_v);
    const int64_t first = int64_t(ep.ep_rank()) * E_local - w.first_expert;
    float* dxg = device_.allocate_zeroed<float>(size_t(R) * C, "backward work");
    const int pieces = co_await pieces_wanted() ? kExpertPieces : 1;
    for (const ExpertRange& piece : expert_pieces(a.expert_offsets, E_local, pieces)) {
      expert_ffn_backward_piece(ops_, dxg, g.w1 + first, g.w3 + first, g.w2 + first,
                                dy_local.data(), a.xg, a.ffn_a, a.ffn_b, w.w1 + first, w.w3 + first,
                                w.w2 + first, a.expert_offsets, piece, C, F, device_);
      co_await progress_point();
    }
    // dx[n] += (sum over k in slot order of the rows of (n, k)), as moe_gather_backward does.
    ep.begin_dispatch_backward(dxg);
    co_await exchange(ep.chain());
    const std::vector<float> dx_tokens = ep.finish_dispatch_backward();
    if (!token_split_) {
      std::memcpy(dweight, dweight_v.data(), dweight_v.size() * sizeof(float));
      for (size_t i = 0; i < dx_tokens.size(); ++i) dx[i] += dx_tokens[i];
      co_return;
    }
    gather_split_backward(own, dx_tokens.data(), dweight_v.data(), N, dx, dweight);
  }
}

template <typename T>
void MoeBlock<T>::gather_split_backward(RowShare own, const float* dx_rows,
                                        const float* dweight_rows, int N, float* dx,
                                        float* dweight) const {
  // Every row's input gradient and top-k weight gradients from the rank that had it: one
  // allgather of rows of C + K floats over the TP group.
  const int C = config_.d_model, K = config_.top_k, width = C + K;
  ArenaScope scope(device_);
  float* both = device_.allocate<float>(size_t(N) * width, "backward work");
  for (int n = 0; n < own.count; ++n) {
    float* row = both + int64_t(own.first + n) * width;
    std::memcpy(row, dx_rows + int64_t(n) * C, size_t(C) * sizeof(float));
    std::memcpy(row + C, dweight_rows + int64_t(n) * K, size_t(K) * sizeof(float));
  }
  token_split_->allgather_rows(both, N, width);
  for (int n = 0; n < N; ++n) {
    const float* row = both + int64_t(n) * width;
    for (int c = 0; c < C; ++c) dx[int64_t(n) * C + c] += row[c];
    std::memcpy(dweight + int64_t(n) * K, row + C, size_t(K) * sizeof(float));
  }
}

template <typename T>
ResumablePass MoeBlock<T>::routed_forward_overlapped(MoeWeights<T> w, const T* x, T* out, int N,
                                                     const MoeActivations<T>& a,
                                                     OverlappedExperts& overlap) const {
  if constexpr (!std::is_same_v<T, float>) {
    (void)w, (void)x, (void)out, (void)N, (void)a, (void)overlap;
    throw std::logic_error("MoeBlock: expert parallelism needs float parameters");
    co_return;
  } else {
    const ExpertDispatcher& d = overlap.dispatcher(0);
    // This rank's first expert, counted from the first expert the weights hold.
    const int64_t first = int64_t(d.ep_rank()) * d.local_experts() - w.first_expert;
    const LocalExperts local{w.w1 + first, w.w3 + first, w.w2 + first};
    const int C = config_.d_model, K = config_.top_k;
    const RowShare own = own_rows(N);
    co_await overlap.forward_pass(
        local, x + int64_t(own.first) * C, a.expert_idx + int64_t(own.first) * K,
        a.expert_weight + int64_t(own.first) * K, own.count, K, out + int64_t(own.first) * C);
    if (token_split_) token_split_->allgather_rows(out, N, C);
  }
}

template <typename T>
ResumablePass MoeBlock<T>::routed_backward_overlapped(MoeWeights<T> w, MoeWeights<T> g,
                                                      const T* dout, T* dx, T* dweight, int N,
                                                      OverlappedExperts& overlap) const {
  if constexpr (!std::is_same_v<T, float>) {
    (void)w, (void)g, (void)dout, (void)dx, (void)dweight, (void)N, (void)overlap;
    throw std::logic_error("MoeBlock: expert parallelism needs float parameters");
    co_return;
  } else {
    const ExpertDispatcher& d = overlap.dispatcher(0);
    const int64_t first = int64_t(d.ep_rank()) * d.local_experts() - w.first_expert;
    const LocalExperts local{w.w1 + first, w.w3 + first, w.w2 + first};
    const LocalExpertGradients grads{g.w1 + first, g.w3 + first, g.w2 + first};
    if (!token_split_) {
      co_await overlap.backward_pass(local, grads, dout, dx, dweight);
      co_return;
    }
    // This rank's rows (the forward's share): their gradients, then everyone's over the TP group.
    const int C = config_.d_model, K = config_.top_k;
    const RowShare own = own_rows(N);
    ArenaScope scope(device_);
    float* dx_rows = device_.allocate_zeroed<float>(size_t(own.count) * C, "backward work");
    float* dweight_rows = device_.allocate_zeroed<float>(size_t(own.count) * K, "backward work");
    co_await overlap.backward_pass(local, grads, dout + int64_t(own.first) * C, dx_rows,
                                   dweight_rows);
    gather_split_backward(own, dx_rows, dweight_rows, N, dx, dweight);
  }
}

template class MoeBlock<float>;
template class MoeBlock<double>;

}  // namespace rlf
