// Causal attention over packed sequences and single-token decode against a KV cache.
//
// Training forward and the dq part of backward: one thread per (query token, head), a block per
// 64 consecutive tokens and one head; keys stream through shared memory in tiles and the
// softmax is online (running max and sum), so nothing of size T x T is ever stored. A block may
// span a sequence boundary: each query masks the keys of its own sequence, [start, i].
// dk and dv: one thread per (key token, head), queries streamed the same way; every gradient row
// is summed by one thread in a fixed order (no atomics).
// The head dimension is a template bound (32, 64, 128, 256) so per-thread rows stay in
// registers; larger heads are rejected.
// Decode: a block per (batch row, head); scores of the cached positions in device scratch.
#include <stdexcept>
#include <string>

#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/reduce.h"
#include "kernels/cuda/runtime.h"

// Loops over a row are unrolled (the row stays in registers) for heads up to 64; larger rows
// spill to local memory anyway, and unrolling them only lengthens the compile.
#if defined(RLF_CUDA_EMULATION)
#define RLF_UNROLL
#else
#define RLF_UNROLL _Pragma("unroll (DMAX <= 64 ? DMAX : 1)")
#endif

namespace rlf::RLF_CUDA_NS {
namespace {

constexpr int kRowsPerBlock = 64;  // query (or key) threads per block
constexpr int kMaxHeadDim = 256;

// Rows of a shared-memory tile: 2 tiles of tile_rows x D floats stay <= 32 KiB.
template <int DMAX>
struct TileRows {
  static constexpr int value = DMAX <= 128 ? 32 : 16;
};

// seq_start[t], seq_end[t] of every token t in [seq_offsets[0], seq_offsets[S]).
__global__ void sequence_bounds_kernel(int* seq_start, int* seq_end, const int* seq_offsets) {
  const int s = int(blockIdx.x);
  const int begin = seq_offsets[s], end = seq_offsets[s + 1];
  for (int t = begin + int(threadIdx.x); t < end; t += int(blockDim.x)) {
    seq_start[t] = begin;
    seq_end[t] = end;
  }
}

// Rows [first, first + rows) of head h of two [N, H, D] tensors into shared memory, zeros for
// rows past `last`; every thread of the block takes part.
__device__ __forceinline__ void load_rows(float* a_tile, float* b_tile, const float* a,
                                          const float* b, int first, int rows, int last,
                                          int64_t row, int h, int D) {
  for (int e = int(threadIdx.x); e < rows * D; e += int(blockDim.x)) {
    const int t = first + e / D;
    const bool in = t <= last;
    const int64_t at = int64_t(t) * row + int64_t(h) * D + e % D;
    a_tile[e] = in ? a[at] : 0.0f;
    b_tile[e] = in ? b[at] : 0.0f;
  }
}

template <int DMAX>
__global__ void __launch_bounds__(kRowsPerBlock)
    attention_forward_kernel(float* out, float* lse, const float* q, const float* k, const float* v,
                             const int* seq_start, int first, int total, int H, int D,
                             float scale) {
  constexpr int KT = TileRows<DMAX>::value;
  RLF_DYNAMIC_SHARED(float, smem);
  float* Ks = smem;
  float* Vs = smem + KT * D;
  const int h = int(blockIdx.y);
  const int64_t row = int64_t(H) * D;
  const int q0 = first + int(blockIdx.x) * kRowsPerBlock;
  const int i = q0 + int(threadIdx.x);
  const bool valid = i < total;
  const int start = valid ? seq_start[i] : 0;
  float qr[DMAX], acc[DMAX];
  RLF_UNROLL
  for (int d = 0; d < DMAX; ++d) {
    qr[d] = (valid && d < D) ? q[int64_t(i) * row + int64_t(h) * D + d] : 0.0f;
    acc[d] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  const int kmin = seq_start[q0];
  const int last = (q0 + kRowsPerBlock < total ? q0 + kRowsPerBlock : total) - 1;
  for (int kt = kmin; kt <= last; kt += KT) {
    __syncthreads();  // the previous tile is consumed
    load_rows(Ks, Vs, k, v, kt, KT, last, row, h, D);
    __syncthreads();
    if (!valid) continue;
    for (int jj = 0; jj < KT; ++jj) {
      const int j = kt + jj;
      if (j < start || j > i) continue;
      const float* kj = Ks + jj * D;
      float dot = 0.0f;
      RLF_UNROLL
      for (int d = 0; d < DMAX; ++d) {
        if (d < D) dot += qr[d] * kj[d];
      }
      const float s = dot * scale;
      if (s > m) {
        const float correction = expf(m - s);
        l *= correction;
        RLF_UNROLL
        for (int d = 0; d < DMAX; ++d) acc[d] *= correction;
        m = s;
      }
      const float p = expf(s - m);
      l += p;
      const float* vj = Vs + jj * D;
      RLF_UNROLL
      for (int d = 0; d < DMAX; ++d) {
        if (d < D) acc[d] += p * vj[d];
      }
    }
  }
  if (!valid) return;
  const float inv = 1.0f / l;
  float* o = out + int64_t(i) * row + int64_t(h) * D;
  RLF_UNROLL
  for (int d = 0; d < DMAX; ++d) {
    if (d < D) o[d] = acc[d] * inv;
  }
  lse[int64_t(i) * H + h] = m + logf(l);
}

// delta[i, h] = dot(dout_i, out_i): the softmax backward's correction term.
__global__ void attention_delta_kernel(float* delta, const float* dout, const float* out, int first,
                                       int total, int H, int D) {
  const int64_t count = int64_t(total - first) * H;
  for (int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; t < count;
       t += int64_t(gridDim.x) * blockDim.x) {
    const int64_t at = (int64_t(first) * H + t) * D;
    float sum = 0.0f;
    for (int d = 0; d < D; ++d) sum += dout[at + d] * out[at + d];
    delta[int64_t(first) * H + t] = sum;
  }
}

template <int DMAX>
__global__ void __launch_bounds__(kRowsPerBlock)
    attention_dq_kernel(float* dq, const float* dout, const float* lse, const float* delta,
                        const float* q, const float* k, const float* v, const int* seq_start,
                        int first, int total, int H, int D, float scale) {
  constexpr int KT = TileRows<DMAX>::value;
  RLF_DYNAMIC_SHARED(float, smem);
  float* Ks = smem;
  float* Vs = smem + KT * D;
  const int h = int(blockIdx.y);
  const int64_t row = int64_t(H) * D;
  const int q0 = first + int(blockIdx.x) * kRowsPerBlock;
  const int i = q0 + int(threadIdx.x);
  const bool valid = i < total;
  const int start = valid ? seq_start[i] : 0;
  const float lse_i = valid ? lse[int64_t(i) * H + h] : 0.0f;
  const float delta_i = valid ? delta[int64_t(i) * H + h] : 0.0f;
  float qr[DMAX], dor[DMAX], acc[DMAX];
  RLF_UNROLL
  for (int d = 0; d < DMAX; ++d) {
    const int64_t at = int64_t(i) * row + int64_t(h) * D + d;
    qr[d] = (valid && d < D) ? q[at] : 0.0f;
    dor[d] = (valid && d < D) ? dout[at] : 0.0f;
    acc[d] = 0.0f;
  }
  const int kmin = seq_start[q0];
  const int last = (q0 + kRowsPerBlock < total ? q0 + kRowsPerBlock : total) - 1;
  for (int kt = kmin; kt <= last; kt += KT) {
    __syncthreads();
    load_rows(Ks, Vs, k, v, kt, KT, last, row, h, D);
    __syncthreads();
    if (!valid) continue;
    for (int jj = 0; jj < KT; ++jj) {
      const int j = kt + jj;
      if (j < start || j > i) continue;
      const float* kj = Ks + jj * D;
      const float* vj = Vs + jj * D;
      float score = 0.0f, dp = 0.0f;
      RLF_UNROLL
      for (int d = 0; d < DMAX; ++d) {
        if (d < D) {
          score += qr[d] * kj[d];
          dp += dor[d] * vj[d];
        }
      }
      const float p = expf(score * scale - lse_i);
      const float ds = p * (dp - delta_i);
      RLF_UNROLL
      for (int d = 0; d < DMAX; ++d) {
        if (d < D) acc[d] += ds * kj[d];
      }
    }
  }
  if (!valid) return;
  float* g = dq + int64_t(i) * row + int64_t(h) * D;
  RLF_UNROLL
  for (int d = 0; d < DMAX; ++d) {
    if (d < D) g[d] += acc[d] * scale;
  }
}

template <int DMAX>
__global__ void __launch_bounds__(kRowsPerBlock)
    attention_dkdv_kernel(float* dk, float* dv, const float* dout, const float* lse,
                          const float* delta, const float* q, const float* k, const float* v,
                          const int* seq_end, int first, int total, int H, int D, float scale) {
  constexpr int QT = TileRows<DMAX>::value;
  RLF_DYNAMIC_SHARED(float, smem);
  float* Qs = smem;
  float* Os = smem + QT * D;  // dout rows
  float* Ls = smem + 2 * QT * D;
  float* Ds = Ls + QT;
  const int h = int(blockIdx.y);
  const int64_t row = int64_t(H) * D;
  const int k0 = first + int(blockIdx.x) * kRowsPerBlock;
  const int j = k0 + int(threadIdx.x);
  const bool valid = j < total;
  const int end = valid ? seq_end[j] : 0;
  float kr[DMAX], vr[DMAX], dk_acc[DMAX], dv_acc[DMAX];
  RLF_UNROLL
  for (int d = 0; d < DMAX; ++d) {
    const int64_t at = int64_t(j) * row + int64_t(h) * D + d;
    kr[d] = (valid && d < D) ? k[at] : 0.0f;
    vr[d] = (valid && d < D) ? v[at] : 0.0f;
    dk_acc[d] = 0.0f;
    dv_acc[d] = 0.0f;
  }
  const int last_key = (k0 + kRowsPerBlock < total ? k0 + kRowsPerBlock : total) - 1;
  const int qmax = seq_end[last_key] - 1;  // the last query any key of this block sees
  for (int it = k0; it <= qmax; it += QT) {
    __syncthreads();
    load_rows(Qs, Os, q, dout, it, QT, qmax, row, h, D);
    for (int ii = int(threadIdx.x); ii < QT; ii += int(blockDim.x)) {
      const int i = it + ii;
      Ls[ii] = i <= qmax ? lse[int64_t(i) * H + h] : 0.0f;
      Ds[ii] = i <= qmax ? delta[int64_t(i) * H + h] : 0.0f;
    }
    __syncthreads();
    if (!valid) continue;
    for (int ii = 0; ii < QT; ++ii) {
      const int i = it + ii;
      if (i < j || i >= end) continue;
      const float* qi = Qs + ii * D;
      const float* oi = Os + ii * D;
      float score = 0.0f, dp = 0.0f;
      RLF_UNROLL
      for (int d = 0; d < DMAX; ++d) {
        if (d < D) {
          score += qi[d] * kr[d];
          dp += oi[d] * vr[d];
        }
      }
      const float p = expf(score * scale - Ls[ii]);
      const float ds = p * (dp - Ds[ii]);
      RLF_UNROLL
      for (int d = 0; d < DMAX; ++d) {
        if (d < D) {
          dv_acc[d] += p * oi[d];
          dk_acc[d] += ds * qi[d];
        }
      }
    }
  }
  if (!valid) return;
  const int64_t at = int64_t(j) * row + int64_t(h) * D;
  RLF_UNROLL
  for (int d = 0; d < DMAX; ++d) {
    if (d < D) {
      if (dk) dk[at + d] += dk_acc[d] * scale;
      if (dv) dv[at + d] += dv_acc[d];
    }
  }
}

// One block per (batch row b, head h). scores: [B * H, max_len] device scratch.
__global__ void attention_decode_kernel(float* out, float* scores, const float* q,
                                        const float* k_cache, const float* v_cache,
                                        const int* cache_slots, const int* cache_lens, int H, int D,
                                        int max_len, float scale) {
  RLF_DYNAMIC_SHARED(float, qs);
  const int b = int(blockIdx.x) / H, h = int(blockIdx.x) % H;
  const int64_t row = int64_t(H) * D;
  const int len = cache_lens[b];
  const int64_t base = int64_t(cache_slots[b]) * max_len * row + int64_t(h) * D;
  const float* qb = q + int64_t(b) * row + int64_t(h) * D;
  for (int d = int(threadIdx.x); d < D; d += int(blockDim.x)) qs[d] = qb[d];
  __syncthreads();
  float* sc = scores + int64_t(blockIdx.x) * max_len;
  float local_max = -INFINITY;
  for (int t = int(threadIdx.x); t < len; t += int(blockDim.x)) {
    const float* kt = k_cache + base + int64_t(t) * row;
    float dot = 0.0f;
    for (int d = 0; d < D; ++d) dot += qs[d] * kt[d];
    sc[t] = dot * scale;
    local_max = sc[t] > local_max ? sc[t] : local_max;
  }
  const float mx = block_max(local_max, -INFINITY);
  float local_sum = 0.0f;
  for (int t = int(threadIdx.x); t < len; t += int(blockDim.x)) {
    sc[t] = expf(sc[t] - mx);
    local_sum += sc[t];
  }
  const float sum = block_sum(local_sum);  // its barriers also publish sc[]
  float* ob = out + int64_t(b) * row + int64_t(h) * D;
  for (int d = int(threadIdx.x); d < D; d += int(blockDim.x)) {
    float acc = 0.0f;
    for (int t = 0; t < len; ++t) acc += sc[t] * v_cache[base + int64_t(t) * row + d];
    ob[d] = len > 0 ? acc / sum : 0.0f;
  }
}

struct Bounds {
  int first, total;
  int *seq_start, *seq_end;
};

Bounds sequence_bounds(Workspace& ws, const int* d_offsets, int S) {
  Bounds b;
  b.first = ws.read_one(d_offsets, 0);
  b.total = ws.read_one(d_offsets, size_t(S));
  b.seq_start = ws.scratch<int>(size_t(b.total > 0 ? b.total : 1));
  b.seq_end = ws.scratch<int>(size_t(b.total > 0 ? b.total : 1));
  if (b.total > b.first) {
    RLF_LAUNCH(sequence_bounds_kernel, unsigned(S), 128, 0, b.seq_start, b.seq_end, d_offsets);
  }
  return b;
}

void check_head_dim(int D) {
  if (D > kMaxHeadDim) {
    throw std::invalid_argument("CUDA attention: head dimension " + std::to_string(D) +
                                " is above the supported " + std::to_string(kMaxHeadDim));
  }
}

template <int DMAX>
void launch_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                    const Bounds& b, int H, int D, float scale) {
  const dim3 grid(blocks_for(b.total - b.first, kRowsPerBlock), unsigned(H));
  const size_t shared = size_t(2) * TileRows<DMAX>::value * D * sizeof(float);
  RLF_LAUNCH(attention_forward_kernel<DMAX>, grid, kRowsPerBlock, shared, out, lse, q, k, v,
             b.seq_start, b.first, b.total, H, D, scale);
}

template <int DMAX>
void launch_backward(float* dq, float* dk, float* dv, const float* dout, const float* lse,
                     const float* delta, const float* q, const float* k, const float* v,
                     const Bounds& b, int H, int D, float scale) {
  const dim3 grid(blocks_for(b.total - b.first, kRowsPerBlock), unsigned(H));
  constexpr int T = TileRows<DMAX>::value;
  if (dq) {
    RLF_LAUNCH(attention_dq_kernel<DMAX>, grid, kRowsPerBlock, size_t(2) * T * D * sizeof(float),
               dq, dout, lse, delta, q, k, v, b.seq_start, b.first, b.total, H, D, scale);
  }
  if (dk || dv) {
    RLF_LAUNCH(attention_dkdv_kernel<DMAX>, grid, kRowsPerBlock,
               (size_t(2) * T * D + 2 * T) * sizeof(float), dk, dv, dout, lse, delta, q, k, v,
               b.seq_end, b.first, b.total, H, D, scale);
  }
}

}  // namespace

void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                       const int* seq_offsets, int S, int H, int D, Arena& arena) {
  if (S <= 0 || H <= 0 || D <= 0) return;
  check_head_dim(D);
  Workspace ws(arena);
  const int* d_offsets = ws.in(seq_offsets, size_t(S) + 1);
  const Bounds b = sequence_bounds(ws, d_offsets, S);
  if (b.total <= b.first) return;
  const size_t count = size_t(b.total) * H * D;
  const float* d_q = ws.in(q, count);
  const float* d_k = ws.in(k, count);
  const float* d_v = ws.in(v, count);
  // Rows before seq_offsets[0] belong to no sequence and are left as they are.
  float* d_out = ws.inout(out, count);
  float* d_lse = ws.inout(lse, size_t(b.total) * H);
  const float scale = 1.0f / sqrtf(float(D));
  if (D <= 32) {
    launch_forward<32>(d_out, d_lse, d_q, d_k, d_v, b, H, D, scale);
  } else if (D <= 64) {
    launch_forward<64>(d_out, d_lse, d_q, d_k, d_v, b, H, D, scale);
  } else if (D <= 128) {
    launch_forward<128>(d_out, d_lse, d_q, d_k, d_v, b, H, D, scale);
  } else {
    launch_forward<256>(d_out, d_lse, d_q, d_k, d_v, b, H, D, scale);
  }
  ws.finish("attention_forward");
}

void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* out,
                        const float* lse, const float* q, const float* k, const float* v,
                        const int* seq_offsets, int S, int H, int D, Arena& arena) {
  if ((!dq && !dk && !dv) || S <= 0 || H <= 0 || D <= 0) return;
  check_head_dim(D);
  Workspace ws(arena);
  const int* d_offsets = ws.in(seq_offsets, size_t(S) + 1);
  const Bounds b = sequence_bounds(ws, d_offsets, S);
  if (b.total <= b.first) return;
  const size_t count = size_t(b.total) * H * D;
  const float* d_dout = ws.in(dout, count);
  const float* d_out = ws.in(out, count);
  const float* d_lse = ws.in(lse, size_t(b.total) * H);
  const float* d_q = ws.in(q, count);
  const float* d_k = ws.in(k, count);
  const float* d_v = ws.in(v, count);
  float* d_dq = ws.inout(dq, count);
  float* d_dk = ws.inout(dk, count);
  float* d_dv = ws.inout(dv, count);
  float* delta = ws.scratch<float>(size_t(b.total) * H);
  RLF_LAUNCH(attention_delta_kernel, grid_stride_blocks(int64_t(b.total - b.first) * H, 256), 256,
             0, delta, d_dout, d_out, b.first, b.total, H, D);
  const float scale = 1.0f / sqrtf(float(D));
  if (D <= 32) {
    launch_backward<32>(d_dq, d_dk, d_dv, d_dout, d_lse, delta, d_q, d_k, d_v, b, H, D, scale);
  } else if (D <= 64) {
    launch_backward<64>(d_dq, d_dk, d_dv, d_dout, d_lse, delta, d_q, d_k, d_v, b, H, D, scale);
  } else if (D <= 128) {
    launch_backward<128>(d_dq, d_dk, d_dv, d_dout, d_lse, delta, d_q, d_k, d_v, b, H, D, scale);
  } else {
    launch_backward<256>(d_dq, d_dk, d_dv, d_dout, d_lse, delta, d_q, d_k, d_v, b, H, D, scale);
  }
  ws.finish("attention_backward");
}

void attention_decode(float* out, const float* q, const float* k_cache, const float* v_cache,
                      const int* cache_slots, const int* cache_lens, int B, int H, int D,
                      int max_len, Arena& arena) {
  if (B <= 0 || H <= 0 || D <= 0) return;
  Workspace ws(arena);
  const int* d_slots = ws.in(cache_slots, size_t(B));
  const int* d_lens = ws.in(cache_lens, size_t(B));
  // A host cache is staged up to the largest slot used.
  int slot_count = 0;
  if (!detail::device_accessible(k_cache) || !detail::device_accessible(v_cache)) {
    for (int s : ws.read(d_slots, size_t(B))) slot_count = s + 1 > slot_count ? s + 1 : slot_count;
  }
  const size_t cache_count = size_t(slot_count) * size_t(max_len) * H * D;
  const float* d_k = ws.in(k_cache, cache_count);
  const float* d_v = ws.in(v_cache, cache_count);
  const float* d_q = ws.in(q, size_t(B) * H * D);
  float* d_out = ws.out(out, size_t(B) * H * D);
  float* scores = ws.scratch<float>(size_t(B) * H * size_t(max_len > 0 ? max_len : 1));
  const float scale = 1.0f / sqrtf(float(D));
  // q's row in shared memory, padded to whole 16-byte words: nvcc widens the dot product's
  // shared loads (compute-sanitizer's memcheck on an H200 saw a 12-byte read past D = 13 floats).
  const size_t q_shared = size_t((D + 3) / 4 * 4) * sizeof(float);
  RLF_LAUNCH(attention_decode_kernel, unsigned(B * H), 128, q_shared, d_out, scores, d_q, d_k, d_v,
             d_slots, d_lens, H, D, max_len, scale);
  ws.finish("attention_decode");
}

}  // namespace rlf::RLF_CUDA_NS
