// Fast float MoE gather/combine and grouped SwiGLU expert FFN.
//
// The expert FFN is a handful of large Eigen GEMMs per expert. Row-wise work (forward, dh, dxg)
// is split into fixed (expert, 128-row block) tasks that each own their rows; the weight
// gradients (reductions over an expert's rows) are split into fixed (expert, output-row block)
// tasks that each run one GEMM over all of that expert's rows. Nothing depends on scheduling, so
// results are bit-identical for any thread count.
#include "kernels/moe.h"

#include <Eigen/Core>
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/arena.h"
#include "kernels/parallel.h"

namespace rlf::cpu {
namespace {

using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MapM = Eigen::Map<RowMat>;
using CMapM = Eigen::Map<const RowMat>;
using ArrMap = Eigen::Map<Eigen::ArrayXf>;
using CArrMap = Eigen::Map<const Eigen::ArrayXf>;

constexpr int64_t kRowBlock = 128;     // grouped rows per forward / dxg task
constexpr int64_t kWeightBlock = 128;  // output rows of a weight gradient per task
constexpr int64_t kLane = 64;          // columns accumulated at once in gather/combine

// Tokens per parallel chunk for the row copies and k-sums (pure per-token work, any partition
// gives the same bits; this only sets the task size).
int64_t token_grain(int C) {
  return std::max<int64_t>(1, 16384 / std::max(1, C));
}

// Fixed (expert, row block) tasks: block_start[e] = index of expert e's first task.
struct RowTasks {
  const int* offsets;
  int64_t* block_start;  // [E + 1]
  int E;

  int64_t count() const { return block_start[E]; }
  // Expert and row range [r0, r1) of task t.
  void get(int64_t t, int& e, int64_t& r0, int64_t& r1) const {
    e = int(std::upper_bound(block_start, block_start + E + 1, t) - block_start) - 1;
    r0 = offsets[e] + (t - block_start[e]) * kRowBlock;
    r1 = std::min<int64_t>(offsets[e + 1], r0 + kRowBlock);
  }
};

RowTasks make_row_tasks(const int* offsets, int E, Arena& scratch) {
  RowTasks t{offsets, scratch.allocate<int64_t>(size_t(E) + 1, "expert_ffn tasks"), E};
  t.block_start[0] = 0;
  for (int e = 0; e < E; ++e)
    t.block_start[e + 1] = t.block_start[e] + num_blocks(offsets[e + 1] - offsets[e], kRowBlock);
  return t;
}

}  // namespace

void moe_gather(float* xg, const float* x, const int* token_of_row, int M, int C, Arena& scratch) {
  parallel_for_chunks(M, token_grain(C), [&](int64_t begin, int64_t end) {
    for (int64_t m = begin; m < end; ++m)
      std::memcpy(xg + m * C, x + int64_t(token_of_row[m]) * C, sizeof(float) * size_t(C));
  });
}

void moe_gather_backward(float* dx, const float* dxg, const int* row_of_assignment, int N, int K,
                         int C, Arena& scratch) {
  if (!dx) return;
  parallel_for_chunks(N, token_grain(C), [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      const int* rows = row_of_assignment + n * K;
      for (int64_t c0 = 0; c0 < C; c0 += kLane) {
        const int64_t w = std::min<int64_t>(kLane, C - c0);
        float acc[kLane] = {};
        for (int64_t k = 0; k < K; ++k) {
          const float* src = dxg + int64_t(rows[k]) * C + c0;
          for (int64_t j = 0; j < w; ++j) acc[j] += src[j];
        }
        float* dst = dx + n * C + c0;
        for (int64_t j = 0; j < w; ++j) dst[j] += acc[j];
      }
    }
  });
}

void moe_combine(float* out, const float* y, const float* expert_weight,
                 const int* row_of_assignment, int N, int K, int C, Arena& scratch) {
  parallel_for_chunks(N, token_grain(C), [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      const int* rows = row_of_assignment + n * K;
      const float* wt = expert_weight + n * K;
      for (int64_t c0 = 0; c0 < C; c0 += kLane) {
        const int64_t w = std::min<int64_t>(kLane, C - c0);
        float acc[kLane] = {};
        for (int64_t k = 0; k < K; ++k) {
          const float* src = y + int64_t(rows[k]) * C + c0;
          const float wk = wt[k];
          for (int64_t j = 0; j < w; ++j) acc[j] += wk * src[j];
        }
        std::memcpy(out + n * C + c0, acc, sizeof(float) * size_t(w));
      }
    }
  });
}

void moe_combine_backward(float* dy, float* dexpert_weight, const float* dout, const float* y,
                          const float* expert_weight, const int* row_of_assignment, int N, int K,
                          int C, Arena& scratch) {
  if (!dy && !dexpert_weight) return;
  parallel_for_chunks(N, token_grain(C), [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      CArrMap g(dout + n * C, C);
      for (int64_t k = 0; k < K; ++k) {
        const int64_t row = row_of_assignment[n * K + k];
        if (dy) ArrMap(dy + row * C, C) += expert_weight[n * K + k] * g;
        if (dexpert_weight) dexpert_weight[n * K + k] += (g * CArrMap(y + row * C, C)).sum();
      }
    }
  });
}

void expert_ffn_forward(float* y, float* a, float* b, const float* xg, const float* const* w1,
                        const float* const* w3, const float* const* w2, const int* expert_offsets,
                        int E, int C, int F, Arena& scratch) {
  const int64_t M = expert_offsets[E];
  if (M <= 0) return;
  ArenaScope scope(scratch);
  const RowTasks tasks = make_row_tasks(expert_offsets, E, scratch);
  float* h = scratch.allocate<float>(size_t(M) * F, "expert_ffn_forward h");
  parallel_for_chunks(tasks.count(), 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      int e;
      int64_t r0, r1;
      tasks.get(t, e, r0, r1);
      const int64_t rows = r1 - r0;
      CMapM X(xg + r0 * C, rows, C);
      MapM A(a + r0 * F, rows, F), B(b + r0 * F, rows, F), H(h + r0 * F, rows, F);
      A.noalias() = X * CMapM(w1[e], F, C).transpose();
      B.noalias() = X * CMapM(w3[e], F, C).transpose();
      // h = silu(a) * b = a * b / (1 + exp(-a)), one fused pass over the block.
      H.array() = A.array() * B.array() / (1.0f + (-A.array()).exp());
      MapM(y + r0 * C, rows, C).noalias() = H * CMapM(w2[e], C, F).transpose();
    }
  });
}

void expert_ffn_backward(float* dxg, float* const* dw1, float* const* dw3, float* const* dw2,
                         const float* dy, const float* xg, const float* a, const float* b,
                         const float* const* w1, const float* const* w3, const float* const* w2,
                         const int* expert_offsets, int E, int C, int F, Arena& scratch) {
  const int64_t M = expert_offsets[E];
  if (M <= 0 || (!dxg && !dw1 && !dw3 && !dw2)) return;
  ArenaScope scope(scratch);
  const RowTasks tasks = make_row_tasks(expert_offsets, E, scratch);
  const bool need_dh = dxg || dw1 || dw3;
  float* h = scratch.allocate<float>(size_t(M) * F, "expert_ffn_backward h");
  float* da = need_dh ? scratch.allocate<float>(size_t(M) * F, "expert_ffn_backward da") : nullptr;
  float* db = need_dh ? scratch.allocate<float>(size_t(M) * F, "expert_ffn_backward db") : nullptr;
  float* sig = scratch.allocate<float>(size_t(tasks.count()) * F, "expert_ffn_backward sigmoid");

  // Phase 1, per (expert, row block): dh = dy W2_e (written into h's rows, then overwritten by h),
  // the fused SwiGLU backward, and dxg += da W1_e + db W3_e.
  parallel_for_chunks(tasks.count(), 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      int e;
      int64_t r0, r1;
      tasks.get(t, e, r0, r1);
      const int64_t rows = r1 - r0;
      ArrMap s(sig + t * F, F);
      if (need_dh) {
        MapM(h + r0 * F, rows, F).noalias() = CMapM(dy + r0 * C, rows, C) * CMapM(w2[e], C, F);
      }
      for (int64_t m = r0; m < r1; ++m) {
        CArrMap av(a + m * F, F), bv(b + m * F, F);
        ArrMap hv(h + m * F, F);
        s = (1.0f + (-av).exp()).inverse();
        if (need_dh) {
          // hv holds dh here. silu'(a) = s * (1 + a * (1 - s)).
          ArrMap(da + m * F, F) = hv * bv * s * (1.0f + av * (1.0f - s));
          ArrMap(db + m * F, F) = hv * av * s;
        }
        hv = av * s * bv;
      }
      if (dxg) {
        MapM dX(dxg + r0 * C, rows, C);
        dX.noalias() += CMapM(da + r0 * F, rows, F) * CMapM(w1[e], F, C);
        dX.noalias() += CMapM(db + r0 * F, rows, F) * CMapM(w3[e], F, C);
      }
    }
  });

  // Phase 2, per (expert, weight, output-row block): one GEMM over all of the expert's rows.
  const int64_t nbF = num_blocks(F, kWeightBlock), nbC = num_blocks(C, kWeightBlock);
  const int64_t n1 = dw1 ? nbF : 0, n3 = dw3 ? nbF : 0, n2 = dw2 ? nbC : 0;
  const int64_t per_expert = n1 + n3 + n2;
  parallel_for_chunks(int64_t(E) * per_expert, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int e = int(t / per_expert);
      int64_t j = t % per_expert;
      const int64_t e0 = expert_offsets[e], rows = expert_offsets[e + 1] - e0;
      if (rows == 0) continue;
      if (j < n1 + n3) {
        // dW1_e (or dW3_e) rows [f0, f0 + nf) += da_e[:, f0:f0+nf]^T xg_e.
        const bool is_w1 = j < n1;
        if (!is_w1) j -= n1;
        const int64_t f0 = j * kWeightBlock, nf = std::min<int64_t>(kWeightBlock, F - f0);
        CMapM G(is_w1 ? da + e0 * F : db + e0 * F, rows, F);
        MapM dW((is_w1 ? dw1 : dw3)[e] + f0 * C, nf, C);
        dW.noalias() += G.middleCols(f0, nf).transpose() * CMapM(xg + e0 * C, rows, C);
      } else {
        // dW2_e rows [c0, c0 + nc) += dy_e[:, c0:c0+nc]^T h_e.
        j -= n1 + n3;
        const int64_t c0 = j * kWeightBlock, nc = std::min<int64_t>(kWeightBlock, C - c0);
        MapM dW(dw2[e] + c0 * F, nc, F);
        dW.noalias() +=
            CMapM(dy + e0 * C, rows, C).middleCols(c0, nc).transpose() * CMapM(h + e0 * F, rows, F);
      }
    }
  });
}

}  // namespace rlf::cpu
