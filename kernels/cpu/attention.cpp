// Fast float causal attention over packed sequences (flash-attention style tiling).
//
// Each (sequence, head) is cut into blocks of kBlock tokens aligned at the sequence start, so a
// tile (query block qb, key block kb) is fully visible for kb < qb and lower-triangular for
// kb == qb. Tiles are Eigen products on strided views of [N, H, D] (outer stride H * D); scratch
// is per fixed chunk, taken from the arena before the parallel loop.
//
// forward:  one work item per (sequence, query block, head); online softmax over key blocks.
// backward: one work item per (sequence, head), which owns all of that pair's dq, dk, dv rows;
//           outer loop over key blocks (dk, dv accumulated in scratch), inner over query blocks
//           (dq accumulated in place), so every sum has a fixed order.
// decode:   one work item per (batch row, head): two GEMVs on the cache slot.
#include "kernels/attention.h"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "kernels/arena.h"
#include "kernels/parallel.h"

namespace rlf::cpu {
namespace {

using RowMat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MatMap = Eigen::Map<RowMat>;
using ConstHeadMap = Eigen::Map<const RowMat, 0, Eigen::OuterStride<>>;
using HeadMap = Eigen::Map<RowMat, 0, Eigen::OuterStride<>>;
using Vec = Eigen::Matrix<float, Eigen::Dynamic, 1>;
using ConstVecMap = Eigen::Map<const Vec>;
using VecMap = Eigen::Map<Vec>;

constexpr int64_t kBlock = 64;      // tokens per query / key block
constexpr int64_t kMaxChunks = 64;  // bounds the per-chunk scratch

// rows [first, first + count) of head h in a [N, H, D] tensor
ConstHeadMap head_rows(const float* x, int64_t first, int64_t count, int h, int H, int D) {
  const int64_t row = int64_t(H) * D;
  return ConstHeadMap(x + first * row + int64_t(h) * D, count, D, Eigen::OuterStride<>(row));
}
HeadMap head_rows(float* x, int64_t first, int64_t count, int h, int H, int D) {
  const int64_t row = int64_t(H) * D;
  return HeadMap(x + first * row + int64_t(h) * D, count, D, Eigen::OuterStride<>(row));
}

// Grain giving at most kMaxChunks fixed chunks of n items (a function of n only).
int64_t chunk_grain(int64_t n) {
  return std::max<int64_t>(1, (n + kMaxChunks - 1) / kMaxChunks);
}

}  // namespace

void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                       const int* seq_offsets, int S, int H, int D, Arena& scratch) {
  if (S <= 0 || H <= 0 || D <= 0) return;
  ArenaScope scope(scratch);
  const float scale = 1.0f / std::sqrt(float(D));

  // Work items: (sequence, query block) pairs, times H heads.
  int64_t pairs = 0;
  for (int s = 0; s < S; ++s) pairs += num_blocks(seq_offsets[s + 1] - seq_offsets[s], kBlock);
  if (pairs == 0) return;
  int* pair_seq = scratch.allocate<int>(size_t(pairs), "attention_forward items");
  int* pair_block = scratch.allocate<int>(size_t(pairs), "attention_forward items");
  {
    int64_t p = 0;
    for (int s = 0; s < S; ++s) {
      const int64_t blocks = num_blocks(seq_offsets[s + 1] - seq_offsets[s], kBlock);
      for (int64_t b = 0; b < blocks; ++b, ++p) {
        pair_seq[p] = s;
        pair_block[p] = int(b);
      }
    }
  }
  const int64_t items = pairs * H;
  const int64_t grain = chunk_grain(items);
  const int64_t chunks = num_blocks(items, grain);
  // Per chunk: scores [B, B], accumulator [B, D], running max and sum [B] each.
  const int64_t per_chunk = kBlock * kBlock + kBlock * D + 2 * kBlock;
  float* work = scratch.allocate<float>(size_t(chunks * per_chunk), "attention_forward scratch");

  parallel_for_chunks(items, grain, [&](int64_t begin, int64_t end) {
    float* base = work + (begin / grain) * per_chunk;
    float* score_buf = base;
    float* acc_buf = score_buf + kBlock * kBlock;
    float* m = acc_buf + kBlock * D;
    float* l = m + kBlock;
    for (int64_t item = begin; item < end; ++item) {
      const int64_t p = item / H;
      const int h = int(item % H);
      const int64_t start = seq_offsets[pair_seq[p]], stop = seq_offsets[pair_seq[p] + 1];
      const int64_t qb = pair_block[p];
      const int64_t q0 = start + qb * kBlock;
      const int64_t nq = std::min(kBlock, stop - q0);
      const auto Q = head_rows(q, q0, nq, h, H, D);
      MatMap acc(acc_buf, nq, D);
      acc.setZero();
      std::fill(m, m + nq, -std::numeric_limits<float>::infinity());
      std::fill(l, l + nq, 0.0f);
      for (int64_t kb = 0; kb <= qb; ++kb) {
        const int64_t k0 = start + kb * kBlock;
        const bool diagonal = kb == qb;
        const int64_t nk = diagonal ? nq : kBlock;
        MatMap P(score_buf, nq, nk);
        P.noalias() = scale * Q * head_rows(k, k0, nk, h, H, D).transpose();
        for (int64_t r = 0; r < nq; ++r) {
          const int64_t len = diagonal ? r + 1 : nk;  // visible keys of this row in the tile
          auto visible = P.row(r).head(len);
          const float m_new = std::max(m[r], visible.maxCoeff());
          visible = (visible.array() - m_new).exp();
          P.row(r).tail(nk - len).setZero();
          const float alpha = std::exp(m[r] - m_new);  // 0 for the first tile (m = -inf)
          l[r] = l[r] * alpha + visible.sum();
          if (alpha != 1.0f) acc.row(r) *= alpha;
          m[r] = m_new;
        }
        acc.noalias() += P * head_rows(v, k0, nk, h, H, D);
      }
      auto O = head_rows(out, q0, nq, h, H, D);
      for (int64_t r = 0; r < nq; ++r) {
        O.row(r) = acc.row(r) * (1.0f / l[r]);
        lse[(q0 + r) * H + h] = m[r] + std::log(l[r]);
      }
    }
  });
}

void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* out,
                        const float* lse, const float* q, const float* k, const float* v,
                        const int* seq_offsets, int S, int H, int D, Arena& scratch) {
  if (!dq && !dk && !dv) return;
  if (S <= 0 || H <= 0 || D <= 0) return;
  ArenaScope scope(scratch);
  const float scale = 1.0f / std::sqrt(float(D));
  const int64_t N = seq_offsets[S] - seq_offsets[0];
  const int64_t first = seq_offsets[0];
  const bool need_ds = dq || dk;

  // delta[i, h] = rowsum(dO * O), only needed for dS.
  float* delta = nullptr;
  if (need_ds && N > 0) {
    delta = scratch.allocate<float>(size_t(N * H), "attention_backward delta");
    const int64_t rows = N * H;
    parallel_for_chunks(rows, std::max<int64_t>(256, chunk_grain(rows)), [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        const int64_t off = (first * H + r) * D;
        delta[r] = ConstVecMap(dout + off, D).dot(ConstVecMap(out + off, D));
      }
    });
  }

  const int64_t items = int64_t(S) * H;  // (sequence, head) pairs
  const int64_t grain = chunk_grain(items);
  const int64_t chunks = num_blocks(items, grain);
  // Per chunk: P and dP/dS tiles [B, B], dK and dV accumulators [B, D].
  const int64_t per_chunk = 2 * kBlock * kBlock + 2 * kBlock * D;
  float* work = scratch.allocate<float>(size_t(chunks * per_chunk), "attention_backward scratch");

  parallel_for_chunks(items, grain, [&](int64_t begin, int64_t end) {
    float* base = work + (begin / grain) * per_chunk;
    float* p_buf = base;
    float* ds_buf = p_buf + kBlock * kBlock;
    float* dk_buf = ds_buf + kBlock * kBlock;
    float* dv_buf = dk_buf + kBlock * D;
    for (int64_t item = begin; item < end; ++item) {
      const int s = int(item / H);
      const int h = int(item % H);
      const int64_t start = seq_offsets[s], stop = seq_offsets[s + 1];
      const int64_t blocks = num_blocks(stop - start, kBlock);
      for (int64_t kb = 0; kb < blocks; ++kb) {
        const int64_t k0 = start + kb * kBlock;
        const int64_t nk = std::min(kBlock, stop - k0);
        const auto K = head_rows(k, k0, nk, h, H, D);
        const auto V = head_rows(v, k0, nk, h, H, D);
        MatMap dK(dk_buf, nk, D);
        MatMap dV(dv_buf, nk, D);
        if (dk) dK.setZero();
        if (dv) dV.setZero();
        for (int64_t qb = kb; qb < blocks; ++qb) {
          const int64_t q0 = start + qb * kBlock;
          const int64_t nq = std::min(kBlock, stop - q0);
          const bool diagonal = qb == kb;  // then nq == nk and key j is visible to row r if j <= r
          const auto Q = head_rows(q, q0, nq, h, H, D);
          const auto dO = head_rows(dout, q0, nq, h, H, D);
          MatMap P(p_buf, nq, nk);
          P.noalias() = scale * Q * K.transpose();
          for (int64_t r = 0; r < nq; ++r) {
            const int64_t len = diagonal ? r + 1 : nk;
            auto visible = P.row(r).head(len);
            visible = (visible.array() - lse[(q0 + r) * H + h]).exp();
            P.row(r).tail(nk - len).setZero();
          }
          if (dv) dV.noalias() += P.transpose() * dO;
          if (need_ds) {
            MatMap dS(ds_buf, nq, nk);
            dS.noalias() = dO * V.transpose();  // dP
            for (int64_t r = 0; r < nq; ++r) {
              const float d = delta[(q0 - first + r) * H + h];
              dS.row(r) = P.row(r).array() * (dS.row(r).array() - d);
            }
            if (dk) dK.noalias() += dS.transpose() * Q;
            if (dq) head_rows(dq, q0, nq, h, H, D).noalias() += scale * dS * K;
          }
        }
        if (dk) head_rows(dk, k0, nk, h, H, D) += scale * dK;
        if (dv) head_rows(dv, k0, nk, h, H, D) += dV;
      }
    }
  });
}

void attention_decode(float* out, const float* q, const float* k_cache, const float* v_cache,
                      const int* cache_slots, const int* cache_lens, int B, int H, int D,
                      int max_len, Arena& scratch) {
  if (B <= 0 || H <= 0 || D <= 0) return;
  ArenaScope scope(scratch);
  const float scale = 1.0f / std::sqrt(float(D));
  const int64_t row = int64_t(H) * D;
  int64_t longest = 1;
  for (int b = 0; b < B; ++b) longest = std::max<int64_t>(longest, cache_lens[b]);
  longest = std::min<int64_t>(longest, std::max(1, max_len));

  // Items are (row, head) pairs; a chunk should hold at least ~32K multiply-adds of work.
  const int64_t items = int64_t(B) * H;
  const int64_t min_items = std::max<int64_t>(1, (int64_t(1) << 15) / (longest * D * 2));
  const int64_t grain = std::max(chunk_grain(items), min_items);
  const int64_t chunks = num_blocks(items, grain);
  float* work = scratch.allocate<float>(size_t(chunks * longest), "attention_decode scores");

  parallel_for_chunks(items, grain, [&](int64_t begin, int64_t end) {
    float* p_buf = work + (begin / grain) * longest;
    for (int64_t item = begin; item < end; ++item) {
      const int64_t b = item / H;
      const int h = int(item % H);
      const int64_t len = std::min<int64_t>(cache_lens[b], max_len);
      VecMap o(out + b * row + int64_t(h) * D, D);
      if (len <= 0) {
        o.setZero();
        continue;
      }
      const int64_t offset = int64_t(cache_slots[b]) * max_len * row + int64_t(h) * D;
      const ConstHeadMap K(k_cache + offset, len, D, Eigen::OuterStride<>(row));
      const ConstHeadMap V(v_cache + offset, len, D, Eigen::OuterStride<>(row));
      const ConstVecMap qv(q + b * row + int64_t(h) * D, D);
      VecMap p(p_buf, len);
      p.noalias() = scale * K * qv;
      const float max_score = p.maxCoeff();
      p = (p.array() - max_score).exp();
      const float sum = p.sum();
      o.noalias() = V.transpose() * p;
      o *= 1.0f / sum;
    }
  });
}

}  // namespace rlf::cpu
