// The chunked forward/backward pipeline of OverlappedExperts: who is in flight while what
// computes, and the per-expert pieces of compute that drive MPI progress.
#include "src/model/overlapped_experts.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "kernels/error.h"

namespace rlf {

OverlappedExperts::OverlappedExperts(const HierarchicalComm& ep, Links& links, int experts,
                                     DispatchMode mode, int chunks, int d_model, int d_ff,
                                     const Ops<float>& ops, Arena& scratch,
                                     double intra_node_bandwidth, int redundant_slots)
    : ops_(ops), scratch_(scratch), C_(d_model), F_(d_ff) {
  if (chunks < 1) {
    throw ConfigError("--chunks must be >= 1 (1: no overlap), got " + std::to_string(chunks));
  }
  chunks_.resize(size_t(chunks));
  for (Chunk& chunk : chunks_) {
    chunk.dispatcher = std::make_unique<ExpertDispatcher>(ep, links, experts, mode,
                                                          intra_node_bandwidth, redundant_slots);
    chains_.push_back(&chunk.dispatcher->chain());
  }
}

void OverlappedExperts::set_expert_slots(const std::vector<int>& slot_of) {
  for (Chunk& chunk : chunks_) chunk.dispatcher->set_expert_slots(slot_of);
}

void OverlappedExperts::set_slot_experts(const std::vector<int>& slot_expert) {
  for (Chunk& chunk : chunks_) chunk.dispatcher->set_slot_experts(slot_expert);
}

std::vector<int64_t> OverlappedExperts::take_expert_tokens() {
  std::vector<int64_t> sum;
  for (Chunk& chunk : chunks_) {
    const std::vector<int64_t> tokens = chunk.dispatcher->take_expert_tokens();
    sum.resize(tokens.size(), 0);
    for (size_t e = 0; e < tokens.size(); ++e) sum[e] += tokens[e];
  }
  return sum;
}

// Chunk weights 1, 2, ..., 2, 1 (three chunks or more): the first chunk's dispatch and the last
// chunk's combine have no computation to hide behind (the pipeline's fill and drain), so those
// chunks are half the size of the others.
int OverlappedExperts::first_token_of_chunk(int N, int chunk) const {
  const int n = chunks();
  if (n < 3) return int(int64_t(N) * chunk / n);
  const int64_t weight_before = chunk == 0 ? 0 : std::min(2 * chunk - 1, 2 * n - 2);
  return int(int64_t(N) * weight_before / (2 * n - 2));
}

void OverlappedExperts::drive() {
  const double start = steady_seconds();
  for (Chunk& chunk : chunks_) chunk.dispatcher->progress();
  time_.progressing += steady_seconds() - start;
}

ResumablePass OverlappedExperts::wait(Chunk& chunk) {
  const double start = steady_seconds();
  co_await rlf::exchange(chunk.dispatcher->chain(), &chains_);
  // (Run as a pair, this also holds the other pass's work done meanwhile.)
  time_.waiting += steady_seconds() - start;
}

std::vector<OverlappedExperts::Piece> OverlappedExperts::pieces(const Chunk& chunk) const {
  std::vector<Piece> out;
  const int E_local = chunk.dispatcher->local_experts();
  for (int e = 0; e < E_local; ++e) {
    for (int64_t r0 = chunk.offsets[size_t(e)]; r0 < chunk.offsets[size_t(e) + 1];
         r0 += kRowsPerPiece) {
      out.push_back(
          {e, r0, int(std::min<int64_t>(kRowsPerPiece, chunk.offsets[size_t(e) + 1] - r0))});
    }
  }
  return out;
}

void OverlappedExperts::forward_piece(const LocalExperts& w, Chunk& chunk, const Piece& p) {
  const int64_t C = C_, F = F_, r0 = p.first;
  const int e = p.expert, rows[2] = {0, p.rows};
  ops_.expert_ffn_forward(chunk.y.data() + r0 * C, chunk.a.data() + r0 * F, chunk.b.data() + r0 * F,
                          chunk.xg.data() + r0 * C, w.w1 + e, w.w3 + e, w.w2 + e, rows, 1, C_, F_,
                          scratch_);
}

void OverlappedExperts::backward_piece(const LocalExperts& w, const LocalExpertGradients& g,
                                       Chunk& chunk, const Piece& p) {
  const int64_t C = C_, F = F_, r0 = p.first;
  const int e = p.expert, rows[2] = {0, p.rows};
  ops_.expert_ffn_backward(chunk.dxg.data() + r0 * C, g.w1 + e, g.w3 + e, g.w2 + e,
                           chunk.dy.data() + r0 * C, chunk.xg.data() + r0 * C,
                           chunk.a.data() + r0 * F, chunk.b.data() + r0 * F, w.w1 + e, w.w3 + e,
                           w.w2 + e, rows, 1, C_, F_, scratch_);
}

ResumablePass OverlappedExperts::compute_forward(const LocalExperts& w, Chunk& chunk) {
  const int64_t C = C_, F = F_, R = chunk.offsets.back();
  chunk.a.assign(size_t(R * F), 0.0f);
  chunk.b.assign(size_t(R * F), 0.0f);
  chunk.y.assign(size_t(R * C), 0.0f);
  for (const Piece& piece : pieces(chunk)) {
    forward_piece(w, chunk, piece);
    drive();
    co_await progress_point();
  }
}

ResumablePass OverlappedExperts::compute_backward(const LocalExperts& w,
                                                  const LocalExpertGradients& g, Chunk& chunk) {
  chunk.dxg.assign(size_t(chunk.offsets.back() * C_), 0.0f);
  for (const Piece& piece : pieces(chunk)) {
    backward_piece(w, g, chunk, piece);
    drive();
    co_await progress_point();
  }
}

void OverlappedExperts::forward(const LocalExperts& w, const float* x, const int* expert_idx,
                                const float* expert_weight, int N, int K, float* out) {
  run_to_end(forward_pass(w, x, expert_idx, expert_weight, N, K, out));
}

void OverlappedExperts::backward(const LocalExperts& w, const LocalExpertGradients& g,
                                 const float* dout, float* dx, float* dexpert_weight) {
  run_to_end(backward_pass(w, g, dout, dx, dexpert_weight));
}

ResumablePass OverlappedExperts::forward_pass(const LocalExperts& w, const float* x,
                                              const int* expert_idx, const float* expert_weight,
                                              int N, int K, float* out) {
  time_ = {};
  N_ = N;
  K_ = K;
  expert_weight_ = expert_weight;
  const int n = chunks(), C = C_;
  for (int i = 0; i < n; ++i) {
    Chunk& chunk = chunks_[size_t(i)];
    chunk.first_token = first_token_of_chunk(N, i);
    chunk.tokens = first_token_of_chunk(N, i + 1) - chunk.first_token;
  }
  auto begin_dispatch = [&](Chunk& chunk) {
    chunk.dispatcher->begin_dispatch(x + int64_t(chunk.first_token) * C,
                                     expert_idx + int64_t(chunk.first_token) * K, chunk.tokens, K,
                                     C);
  };
  begin_dispatch(chunks_[0]);
  for (int i = 0; i < n; ++i) {
    Chunk& chunk = chunks_[size_t(i)];
    co_await wait(chunk);
    // Begun only now, so that its rows do not compete with chunk i's for the incoming link.
    if (i + 1 < n) begin_dispatch(chunks_[size_t(i) + 1]);
    chunk.xg = chunk.dispatcher->finish_dispatch();
    chunk.offsets = chunk.dispatcher->local_expert_offsets();
    co_await compute_forward(w, chunk);
    chunk.dispatcher->begin_combine(chunk.y.data(), expert_weight + int64_t(chunk.first_token) * K);
  }
  for (Chunk& chunk : chunks_) {
    co_await wait(chunk);
    const std::vector<float> combined = chunk.dispatcher->finish_combine();
    if (!combined.empty()) {
      std::memcpy(out + int64_t(chunk.first_token) * C, combined.data(),
                  combined.size() * sizeof(float));
    }
  }
}

ResumablePass OverlappedExperts::backward_pass(const LocalExperts& w, const LocalExpertGradients& g,
                                               const float* dout, float* dx,
                                               float* dexpert_weight) {
  const int n = chunks(), C = C_, K = K_;
  auto begin_combine_backward = [&](Chunk& chunk) {
    chunk.dispatcher->begin_combine_backward(dout + int64_t(chunk.first_token) * C, chunk.y.data(),
                                             expert_weight_ + int64_t(chunk.first_token) * K);
  };
  begin_combine_backward(chunks_[0]);
  std::vector<float> dweight;
  for (int i = 0; i < n; ++i) {
    Chunk& chunk = chunks_[size_t(i)];
    co_await wait(chunk);
    if (i + 1 < n) begin_combine_backward(chunks_[size_t(i) + 1]);
    chunk.dispatcher->finish_combine_backward(chunk.dy, dweight);
    if (!dweight.empty()) {
      std::memcpy(dexpert_weight + int64_t(chunk.first_token) * K, dweight.data(),
                  dweight.size() * sizeof(float));
    }
    co_await compute_backward(w, g, chunk);
    chunk.dispatcher->begin_dispatch_backward(chunk.dxg.data());
  }
  for (Chunk& chunk : chunks_) {
    co_await wait(chunk);
    const std::vector<float> dx_tokens = chunk.dispatcher->finish_dispatch_backward();
    float* dst = dx + int64_t(chunk.first_token) * C;
    for (size_t i = 0; i < dx_tokens.size(); ++i) dst[i] += dx_tokens[i];
  }
}

void OverlappedExperts::communicate_only(const float* x, const int* expert_idx,
                                         const float* expert_weight, int N, int K,
                                         const float* dout) {
  const int n = chunks(), C = C_;
  std::vector<float> dy, dweight;
  for (int i = 0; i < n; ++i) {
    const int64_t first = first_token_of_chunk(N, i);
    const int64_t tokens = first_token_of_chunk(N, i + 1) - first;
    ExpertDispatcher& d = *chunks_[size_t(i)].dispatcher;
    const std::vector<float> rows =
        d.dispatch(x + first * C, expert_idx + first * K, int(tokens), K, C);
    d.combine(rows.data(), expert_weight + first * K);
    d.combine_backward(dout + first * C, rows.data(), expert_weight + first * K, dy, dweight);
    d.dispatch_backward(rows.data());
  }
}

void OverlappedExperts::compute_only(const LocalExperts& w, const LocalExpertGradients& g) {
  for (Chunk& chunk : chunks_) {
    if (chunk.dy.size() != chunk.xg.size()) {
      throw std::logic_error("OverlappedExperts::compute_only needs a forward and backward first");
    }
    // The FFN alone: no transfer in flight to drive, no driver to offer a progress point to.
    run_to_end(compute_forward(w, chunk));
    run_to_end(compute_backward(w, g, chunk));
  }
}

}  // namespace rlf
