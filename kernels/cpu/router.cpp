// Fast float top-k softmax router and auxiliary loss: parallel over tokens in fixed chunks;
// the aux loss's sums over tokens are per-block partials combined serially in block order.
#include "kernels/router.h"

#include <cmath>
#include <cstdint>

#include "kernels/arena.h"
#include "kernels/parallel.h"
#include "kernels/router_row.h"

namespace rlf::cpu {
namespace {
constexpr int64_t kTokenGrain = 256;  // tokens per parallel chunk
constexpr int64_t kAuxBlock = 1024;   // tokens per aux-loss partial
}  // namespace

void router_forward(int* expert_idx, float* expert_weight, float* probs, const float* logits, int N,
                    int E, int K, bool normalize_topk, Arena& scratch) {
  parallel_for_chunks(N, kTokenGrain, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      detail::router_forward_row(expert_idx + n * K, expert_weight + n * K, probs + n * E,
                                 logits + n * E, E, K, normalize_topk);
    }
  });
}

void router_backward(float* dlogits, const float* dexpert_weight, const float* dprobs,
                     const float* probs, const int* expert_idx, const float* expert_weight, int N,
                     int E, int K, bool normalize_topk, Arena& scratch) {
  if (!dlogits || N <= 0) return;
  ArenaScope scope(scratch);
  // One gradient-at-probs row per fixed chunk.
  float* gbuf =
      scratch.allocate<float>(size_t(num_blocks(N, kTokenGrain)) * E, "router_backward g");
  parallel_for_chunks(N, kTokenGrain, [&](int64_t begin, int64_t end) {
    float* g = gbuf + (begin / kTokenGrain) * E;
    for (int64_t n = begin; n < end; ++n) {
      detail::router_backward_row(dlogits + n * E, g,
                                  dexpert_weight ? dexpert_weight + n * K : nullptr,
                                  dprobs ? dprobs + n * E : nullptr, probs + n * E,
                                  expert_idx + n * K, expert_weight + n * K, E, K, normalize_topk);
    }
  });
}

float router_aux_loss_forward(const float* probs, const int* expert_idx, int N, int E, int K,
                              Arena& scratch) {
  if (N <= 0) return 0.0f;
  ArenaScope scope(scratch);
  const int64_t blocks = num_blocks(N, kAuxBlock);
  double* psum = scratch.allocate<double>(size_t(blocks) * E, "router_aux_loss psum");
  int64_t* count = scratch.allocate<int64_t>(size_t(blocks) * E, "router_aux_loss count");
  parallel_for_chunks(N, kAuxBlock, [&](int64_t begin, int64_t end) {
    const int64_t blk = begin / kAuxBlock;
    double* ps = psum + blk * E;
    int64_t* ct = count + blk * E;
    for (int e = 0; e < E; ++e) {
      ps[e] = 0;
      ct[e] = 0;
    }
    for (int64_t n = begin; n < end; ++n) {
      for (int e = 0; e < E; ++e) ps[e] += probs[n * E + e];
      for (int k = 0; k < K; ++k) ++ct[expert_idx[n * K + k]];
    }
  });
  double loss = 0;
  for (int e = 0; e < E; ++e) {
    double p = 0;
    int64_t c = 0;
    for (int64_t blk = 0; blk < blocks; ++blk) {
      p += psum[blk * E + e];
      c += count[blk * E + e];
    }
    loss += (double(c) / double(int64_t(N) * K)) * (p / double(N));
  }
  return float(double(E) * loss);
}

void router_aux_loss_backward(float* dprobs, float dloss, const int* expert_idx, int N, int E,
                              int K, Arena& scratch) {
  if (!dprobs || N <= 0) return;
  ArenaScope scope(scratch);
  int64_t* count = scratch.allocate<int64_t>(size_t(E), "router_aux_loss_backward count");
  float* g = scratch.allocate<float>(size_t(E), "router_aux_loss_backward g");
  for (int e = 0; e < E; ++e) count[e] = 0;
  for (int64_t i = 0; i < int64_t(N) * K; ++i) ++count[expert_idx[i]];
  for (int e = 0; e < E; ++e) {
    const float f = float(count[e]) / float(int64_t(N) * K);
    g[e] = dloss * float(E) * f / float(N);
  }
  parallel_for_chunks(N, kTokenGrain, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n)
      for (int e = 0; e < E; ++e) dprobs[n * E + e] += g[e];
  });
}

}  // namespace rlf::cpu
